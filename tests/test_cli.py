"""The ``llm-latency`` command: probe against mock-server over HTTP and HTTPS, the JSON shape,
the HTML page in headless Chromium, the demo, and every bad input. Run in process (``run_cli``)
but for what needs a process of its own: mock-server's signals and its port, the demo, and the
exporter's log lines up to the process's exit."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from llm_latency.cli.demo import SCENE_SPANS
from llm_latency.cli.render import PHASE_COLORS
from llm_latency.testing import LocalDNS
from tests.checks import SLACK, TRIES
from tests.command_line import (
    mock_server,
    one_error_line,
    probe_json,
    run_cli,
    run_cli_process,
)
from tests.cpu_waits import collector_pauses, machine_waits
from tests.otlp_receiver import OTLPReceiver
from tests.servers import unused_port

# -- probe against mock-server ------------------------------------------------------------------


@pytest.mark.parametrize("client", ["aiohttp", "httpx2", "requests"])
def test_probe_measures_the_configured_wait(client: str) -> None:
    with mock_server("--ttfb", "0.3", "--tokens", "1", "--tokens-per-second", "1000") as mock:
        report = probe_json(mock.url, "-n", "3", "--client", client)
    requests = report["requests"]
    assert isinstance(requests, list)
    assert len(requests) == 3
    for request in requests:
        assert request["status"] == 200
        assert {"send", "wait", "receive"} <= set(request["phases"])
        # The server answers 0.3 s after it read the request, so sending plus waiting lasts at
        # least that; the wait alone can be a little shorter on a loaded machine, when the
        # process is descheduled between writing the request and noting the send's end.
        sent_and_waited = request["phases"]["send"] + request["phases"]["wait"]
        assert 0.3 - 0.001 <= sent_and_waited <= 0.3 + SLACK
        assert re.fullmatch(r"req_[0-9a-f]{24}", request["request_id"])
        assert request["total"] >= request["phases"]["wait"]
        assert request["time_to_first_chunk"] is None
    assert "connect" in requests[0]["phases"]  # the first opens the connection, the rest reuse it
    assert "connect" not in requests[1]["phases"]
    summary = report["summary"]
    assert isinstance(summary, dict)
    assert set(summary["wait"]) == {"p50", "p95", "max"}
    median = statistics.median(r["phases"]["wait"] for r in requests)
    assert summary["wait"]["p50"] == pytest.approx(median, abs=1e-9)


@pytest.mark.parametrize("client", ["aiohttp", "httpx2", "requests"])
def test_probe_network_overhead_is_never_negative(client: str) -> None:
    """Concurrent requests (-c 4): the send overlaps the server's processing, and the overhead
    (from the start of sending, less the server's time) stays at or above 0."""
    with mock_server("--ttfb", "0.2", "--tokens", "1", "--tokens-per-second", "1000") as mock:
        report = probe_json(mock.url, "-n", "10", "-c", "4", "--client", client)
    requests = report["requests"]
    assert isinstance(requests, list) and len(requests) == 10
    for request in requests:
        assert 0.2 <= request["server_processing"] < 0.2 + SLACK, request  # what it spent
        assert 0 <= request["network_overhead"] < SLACK, request


@pytest.mark.parametrize("client", ["aiohttp", "httpx2", "requests"])
def test_probe_reuses_connections(client: str) -> None:
    """Sequential requests (-c 1) share one connection; -c 3 opens at most three; --fresh opens
    one per request. (requests on worker threads: each thread's own Session would connect.)"""
    with mock_server("--ttfb", "0.02", "--tokens", "1", "--tokens-per-second", "1000") as mock:
        sequential = probe_json(mock.url, "-n", "30", "--client", client)["requests"]
        concurrent = probe_json(mock.url, "-n", "30", "-c", "3", "--client", client)["requests"]
        fresh = probe_json(mock.url, "-n", "4", "--fresh", "--client", client)["requests"]
    assert isinstance(sequential, list) and isinstance(concurrent, list)
    assert isinstance(fresh, list)
    assert [r["status"] for r in sequential + concurrent + fresh] == [200] * 64
    connected = ["connect" in r["phases"] for r in sequential]
    assert connected == [True] + [False] * 29, connected
    assert [r["reused"] for r in sequential] == [False] + [True] * 29
    assert 1 <= sum("connect" in r["phases"] for r in concurrent) <= 3
    assert all("connect" in r["phases"] and r["reused"] is False for r in fresh)


def test_probe_https_with_the_mock_ca() -> None:
    with mock_server("--tls", "--ttfb", "0.2", "--tokens", "1") as mock:
        assert mock.ca_file is not None
        report = probe_json(mock.url, "--cacert", mock.ca_file, "-n", "2", "--fresh")
    requests = report["requests"]
    assert isinstance(requests, list)
    for request in requests:  # --fresh: every request connects and shakes hands
        assert {"connect", "tls", "send", "wait", "receive"} <= set(request["phases"])
        assert 0.2 - 0.005 <= request["phases"]["wait"] <= 0.2 + SLACK


def test_probe_stream_text_output() -> None:
    with mock_server("--ttfb", "0.2", "--tokens", "5", "--tokens-per-second", "20") as mock:
        result = run_cli("probe", mock.url, "--stream", env={"OPENAI_API_KEY": "sk-never-shown-1"})
        report = probe_json(mock.url, "--stream")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for word in ("wait", "receive", "first byte", "first chunk", "end", "server", "rate limit",
                 "p50", "p95"):  # fmt: skip
        assert word in out
    assert "sk-never-shown-1" not in out + result.stderr
    (request,) = report["requests"]
    assert 0.2 - 0.005 <= request["time_to_first_chunk"] <= 0.2 + SLACK
    assert request["stream_events"] == 7  # five tokens, the finish_reason chunk, [DONE]
    assert request["total"] >= 0.2 + 0.2 - 0.005  # four gaps of 50 ms after the first token


def test_probe_compares_several_urls() -> None:
    """Each endpoint's numbers are its own: its percentiles are those of its own requests, and
    the slow server's wait is longer than the fast one's by more than half the 0.2 s injected
    between them (swapped or mixed numbers fail both). A run that misses the second by no
    more than what the machine measurably took meanwhile (the run-queue waits of this
    process's threads, where the probe runs, and of both servers, and the garbage collector's
    pauses: a fast request kept that long looks slow) runs again, up to TRIES times; any other
    miss fails at once. Three requests each: the median is not one request's."""
    with mock_server("--ttfb", "0.1", "--tokens", "1") as fast, \
            mock_server("--ttfb", "0.3", "--tokens", "1") as slow:  # fmt: skip
        result = run_cli("probe", fast.url, slow.url, "-n", "2")
        for _ in range(TRIES):
            pids = (os.getpid(), fast.process.pid, slow.process.pid)
            with machine_waits(*pids) as waited, collector_pauses() as collected:
                report = probe_json(fast.url, slow.url, "-n", "3")
            endpoints = report["endpoints"]
            assert isinstance(endpoints, dict)
            for url in (fast.url, slow.url):
                waits = [r["phases"]["wait"] for r in report["requests"] if r["url"] == url]
                assert len(waits) == 3, report["requests"]
                median = statistics.median(waits)
                assert endpoints[url]["wait"]["p50"] == pytest.approx(median, abs=1e-9), url
            slow_p50 = endpoints[slow.url]["wait"]["p50"]
            fast_p50 = endpoints[fast.url]["wait"]["p50"]
            missed = fast_p50 + 0.1 - slow_p50
            if missed < 0 or missed > waited.peers + collected.seconds:
                break
    assert result.returncode == 0, result.stderr
    assert "endpoints compared" in result.stdout
    fast_rows = [
        {k: r[k] for k in ("phases", "server_processing", "event_loop_lag", "network_overhead")}
        for r in report["requests"]
        if r["url"] == fast.url
    ]
    assert slow_p50 > fast_p50 + 0.1, (
        f"{waited}, the garbage collector ran {collected.seconds:.3f} s; the fast: {fast_rows}"
    )


def test_probe_counts_a_rate_limited_response() -> None:
    with mock_server("--ttfb", "0", "--rate-limit-every", "2", "--tokens", "1") as mock:
        report = probe_json(mock.url, "-n", "2", exit_code=3)
    statuses = sorted(r["status"] for r in report["requests"])
    assert statuses == [200, 429]


def test_probe_html_page_draws_bars(tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium is required (.ci/run installs it)"
    page = tmp_path / "report.html"
    with mock_server("--ttfb", "0.2", "--tokens", "1") as mock:
        result = run_cli("probe", mock.url, "-n", "3", "--html", str(page))
    assert result.returncode == 0, result.stderr
    text = page.read_text()
    assert "http://" not in text.replace(mock.url, "")  # no fetches: nothing but the probed URL
    assert "<script" not in text
    shot = tmp_path / "shot.png"
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars",
         "--window-size=1200,1600", f"--screenshot={shot}", page.as_uri()],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    image = Image.open(shot).convert("RGB")
    wait_color = tuple(int(PHASE_COLORS["wait"][i : i + 2], 16) for i in (1, 3, 5))
    counts = {color: count for count, color in image.getcolors(maxcolors=1 << 24) or []}
    pixels = counts.get(wait_color, 0)
    # Three wait bars (about 200 ms of a 200 ms request each) and the percentile bar.
    assert pixels > 2000, pixels


# -- mock-server ----------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_mock_server_stops_cleanly(signum: int) -> None:
    with mock_server() as mock:
        mock.process.send_signal(signum)
        out, err = mock.process.communicate(timeout=10)
        assert mock.process.returncode == 0, err
        assert "stopped" in out
        assert "Traceback" not in err


def test_mock_server_port_in_use() -> None:
    with mock_server() as mock:
        port = mock.url.split(":")[2].split("/")[0]
        line = one_error_line(run_cli_process("mock-server", "--port", port, timeout=20))
    assert "cannot listen" in line


# -- demo -------------------------------------------------------------------------------------------


def test_demo_prints_every_scene() -> None:
    receiver = OTLPReceiver()
    try:
        result = run_cli_process(
            "demo", timeout=120, env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        )
    finally:
        receiver.stop()
    assert result.returncode == 0, result.stderr
    # Exported, each scene is one trace under a root span named after it (a trace list tells
    # the scenes apart), and no request is outside a scene's trace.
    roots = {span.trace_id: span.name for span in receiver.spans if span.parent_id is None}
    assert sorted(roots.values()) == sorted(SCENE_SPANS.values())
    assert {span.trace_id for span in receiver.spans} == set(roots)
    assert "demo 4: rate-limited, then retried" in {
        roots[span.trace_id] for span in receiver.spans if span.name == "retry.backoff"
    }
    out = result.stdout
    assert not [line for line in out.splitlines() if line != line.rstrip()]  # no trailing spaces
    for scene in ("1a.", "1b.", "2a.", "2b.", "3.", "4.", "5."):
        assert f"\n{scene} " in out
    assert out.count("→ ") == 7
    for phase in ("dns", "connect", "tls", "queue", "wait", "receive", "retry.backoff"):
        assert phase in out
    # The burst scene shows the pool filling to its limit and draining.
    words = " ".join(out.split())
    assert "the pool to the host over time" in words
    assert "The pool filled (2 of 2 connections active) while 6 requests waited" in words
    assert "then drained to 2 idle connections kept alive, and to none" in words
    # Each scene ends with the diagnosis of its spans; the closing line says where each rule fired.
    assert len(re.findall(r"^findings(?:$|: none)", out, re.MULTILINE)) == 7
    # The tokens scene: the server's counts, and the long answer told from a slow provider.
    assert "tokens 2 in, 8 out" in words and "tokens 2 in, 40 out" in words
    assert "because it had 32 more tokens, not because the provider was slower" in words
    recap = words[words.index("The diagnosis, scene by scene: ") :]
    for rule, scenes in (("new-connections", "(1a)"), ("pool-queue", "(3)"),
                         ("rate-limits", "(4)")):  # fmt: skip
        assert f"{rule} {scenes}" in recap, recap
    assert "Traceback" not in result.stderr


# -- bad input ---------------------------------------------------------------------------------------


def test_malformed_url() -> None:
    assert "malformed URL" in one_error_line(run_cli("probe", "ftp//nowhere"))
    assert "malformed URL" in one_error_line(run_cli("probe", "http://"))
    assert "malformed URL" in one_error_line(run_cli("probe", "http://host:99999/"))


def test_unknown_option() -> None:
    line = one_error_line(run_cli("probe", "--frobnicate", "http://127.0.0.1/"))
    assert "frobnicate" in line


def test_header_without_colon() -> None:
    line = one_error_line(run_cli("probe", "-H", "Authorization Bearer x", "http://127.0.0.1/"))
    assert "'Name: value'" in line


def test_unreadable_body_file(tmp_path: Path) -> None:
    line = one_error_line(
        run_cli("probe", "-d", f"@{tmp_path / 'missing.json'}", "http://127.0.0.1/")
    )
    assert "cannot read" in line


def test_refused_connection() -> None:
    line = one_error_line(run_cli("probe", f"http://127.0.0.1:{unused_port()}/v1/chat/completions"))
    assert "connection refused" in line


def test_name_that_does_not_resolve() -> None:
    dns = LocalDNS({"known.test": "127.0.0.1"})
    try:
        line = one_error_line(run_cli("probe", "--dns", dns.nameserver, "http://unknown.test:9/"))
    finally:
        dns.stop()
    assert "cannot resolve unknown.test" in line


def test_tls_failure() -> None:
    with mock_server("--tls") as mock:
        line = one_error_line(run_cli("probe", mock.url.replace("127.0.0.1", "localhost")))
    assert "TLS failure" in line
    assert "certificate verify failed" in line or "unable to get local issuer" in line


@pytest.mark.parametrize("client", ["aiohttp", "httpx2", "requests"])
def test_timeout(client: str) -> None:
    with mock_server("--ttfb", "3") as mock:
        line = one_error_line(run_cli("probe", mock.url, "--timeout", "0.3", "--client", client))
    assert "timed out" in line


def test_probe_exports_otlp_when_the_endpoint_is_set() -> None:
    """With OTEL_EXPORTER_OTLP_ENDPOINT set, the probe's spans and metrics go out over OTLP
    (http/protobuf) too: a loopback receiver gets them."""
    import http.server
    import threading

    received: dict[str, bytes] = {}

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received[self.path] = received.get(self.path, b"") + body
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{collector.server_address[1]}"
        with mock_server("--ttfb", "0.05", "--tokens", "1") as mock:
            result = run_cli("probe", mock.url, "-n", "2",
                             env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})  # fmt: skip
    finally:
        collector.shutdown()
    assert result.returncode == 0, result.stderr
    assert b"http.wait" in received["/v1/traces"]
    assert b"llm-latency-probe" in received["/v1/traces"]  # the service name
    assert b"llm_latency.phase.duration" in received["/v1/metrics"]


# -- secrets: no output shows a URL's credentials or secret query values ------------------------

USER, PASSWORD, API_KEY, KEY = "probe-user-2c9d", "pw-7f3a9e1b", "ak-41d0c8e2", "gk-95be7a10"
SECRETS = (USER, PASSWORD, API_KEY, KEY)
WIDE = {"COLUMNS": "1000"}  # rich wraps at 80 columns: a secret cut in two would hide from `in`


def with_secrets(url: str, extra: str = "") -> str:
    """``url`` with user:password and two secret query parameters (and ``extra`` ones)."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{USER}:{PASSWORD}@{rest}?api_key={API_KEY}&key={KEY}{extra}"


def assert_no_secret(*outputs: str) -> None:
    for output in outputs:
        for secret in SECRETS:
            assert secret not in output, f"{secret} shown in:\n{output}"


def test_probe_text_html_and_several_urls_show_no_secret(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    with mock_server("--ttfb", "0.01", "--tokens", "1") as mock:
        first, second = with_secrets(mock.url), with_secrets(mock.url, "&model=b")
        result = run_cli("probe", first, second, "-n", "2", "--html", str(page), env=WIDE)
    assert result.returncode == 0, result.stderr
    text = page.read_text()
    assert_no_secret(result.stdout, result.stderr, text)
    redacted = mock.url.replace("://", "://REDACTED:REDACTED@") + "?api_key=REDACTED&key=REDACTED"
    assert result.stdout.count(redacted) == 2 + 2  # two headings, two rows of the comparison
    headings = re.findall(r"<h2>.*?</h2>", text)
    assert sum(html.escape(redacted) in h for h in headings) == 2  # one section per URL
    assert "endpoints compared" in result.stdout


def test_probe_json_shows_no_secret() -> None:
    with mock_server("--ttfb", "0.01", "--tokens", "1") as mock:
        first, second = with_secrets(mock.url), with_secrets(mock.url, "&model=b")
        for client in ("aiohttp", "requests"):
            result = run_cli("probe", "--json", "--client", client, first, second, env=WIDE)
            assert result.returncode == 0, result.stderr
            assert_no_secret(result.stdout, result.stderr)
            report = json.loads(result.stdout)
            assert len(report["endpoints"]) == 2
            assert all("REDACTED" in url for url in report["endpoints"])
            assert all("REDACTED" in r["url"] for r in report["requests"])


@pytest.mark.parametrize("client", ["aiohttp", "httpx2", "requests"])
def test_probe_errors_show_no_secret(client: str) -> None:
    refused = with_secrets(f"http://127.0.0.1:{unused_port()}/v1/chat/completions")
    result = run_cli("probe", "--client", client, refused, env=WIDE)
    assert "connection refused" in one_error_line(result)
    assert_no_secret(result.stdout, result.stderr)
    with mock_server("--tokens", "1") as mock:  # HTTPS to a plain HTTP server: a TLS failure
        result = run_cli("probe", "--client", client, with_secrets(mock.url.replace("http:", "https:")),
                         env=WIDE)  # fmt: skip
    assert "TLS failure" in one_error_line(result)
    assert_no_secret(result.stdout, result.stderr)


def test_malformed_url_shows_no_secret() -> None:
    for url in (with_secrets("http://127.0.0.1:99999/"), with_secrets("http://[::1/")):
        result = run_cli("probe", url)
        assert "malformed URL" in one_error_line(result)
        assert_no_secret(result.stderr)


def test_exporter_log_lines_show_no_secret() -> None:
    """The OTLP exporter logs its failures (a refused collector: "Transient error ... retrying")
    with the endpoint's query; the CLI's log lines are redacted too, up to the process's exit
    (hence a process of its own)."""
    endpoint = with_secrets(f"http://127.0.0.1:{unused_port()}/")
    with mock_server("--ttfb", "0", "--tokens", "1") as mock:
        result = run_cli_process("probe", mock.url, env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                                                 "OTEL_EXPORTER_OTLP_TIMEOUT": "2", **WIDE})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Transient error" in result.stderr  # the exporter did log, and retried once
    assert_no_secret(result.stdout, result.stderr)


def test_urls_that_differ_only_in_a_secret_stay_apart() -> None:
    from llm_latency.cli.redaction import scrub, shown

    a, b = "http://h:1/v1/x?api_key=one-secret", "http://h:1/v1/x?api_key=two-secret"
    assert shown([a, b, a]) == {
        a: "http://h:1/v1/x?api_key=REDACTED",
        b: "http://h:1/v1/x?api_key=REDACTED [2]",
    }
    line = scrub(f"failed: {a} (url: /v1/x?api_key=one-secret), password='one-secret'", [a])
    assert "one-secret" not in line
    assert line.count("api_key=REDACTED") == 2


@pytest.mark.parametrize("handler", ["ignored", "the program's own"])
def test_probe_leaves_the_sigint_handler_it_found(handler: str) -> None:
    """The probe's Ctrl-C handling is the event loop's for its run; after it, the handler it
    found is back (asyncio puts back Python's default instead): an ignored SIGINT (a run under
    nohup) stays ignored, a program's own handler stays its own. run_cli checks the signal
    handler among what a command must leave as it found it."""

    def own(signum: int, frame: object) -> None:
        raise AssertionError("no SIGINT was sent")

    wanted = signal.SIG_IGN if handler == "ignored" else own
    before = signal.signal(signal.SIGINT, wanted)
    try:
        with mock_server("--ttfb", "0.01", "--tokens", "1") as mock:
            report = probe_json(mock.url, "-n", "1", "--client", "aiohttp")
        assert len(report["requests"]) == 1
        assert signal.getsignal(signal.SIGINT) is wanted
    finally:
        signal.signal(signal.SIGINT, before)
