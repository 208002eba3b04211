"""``llm-latency probe`` as an everyday tool against mock-server: each request printed as it
finishes (through a pseudo-terminal), Ctrl-C, ``--jsonl``, one ``--timeout`` meaning for every
client, the layout at 60 to 200 columns, percentiles per status class, findings, input errors, a
closed pipe, and mock-server's log of a client that hangs up. What needs a process (a terminal,
SIGINT, output read as it comes, a pipe) runs one; the rest runs in process (``run_cli``)."""

from __future__ import annotations

import itertools
import json
import os
import pty
import re
import select
import signal
import socket
import statistics
import struct
import subprocess
import time

import pytest
from rich.cells import cell_len

from llm_latency.cli.render import CLOCK_NOTE, findings_lines
from tests.bad_servers import RawServer, response
from tests.command_line import (
    CLI,
    as_a_terminals_job,
    environment,
    mock_server,
    one_error_line,
    probe_json,
    run_cli,
)
from tests.servers import unused_port

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
UNIT = r"(?:ms|s|µs)"


def read_until(fd: int, wanted: re.Pattern[str], seen: str = "", limit: float = 60) -> str:
    """Read ``fd`` (a pty's master side) until ``wanted`` matches the text read so far."""
    text = seen
    end = time.monotonic() + limit
    while not wanted.search(text):
        ready, _, _ = select.select([fd], [], [], max(end - time.monotonic(), 0))
        assert ready, f"{wanted.pattern!r} not seen in {limit} s:\n{text}"
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the other side closed
            data = b""
        assert data, f"{wanted.pattern!r} not seen before the end:\n{text}"
        text += ANSI.sub("", data.decode(errors="replace")).replace("\r\n", "\n")
    return text


def read_rest(fd: int, limit: float = 60) -> str:
    text = ""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], max(end - time.monotonic(), 0))
        if not ready:
            break
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        text += ANSI.sub("", data.decode(errors="replace")).replace("\r\n", "\n")
    return text


# -- progressive output and Ctrl-C ------------------------------------------------------------


@pytest.mark.parametrize("client", ["aiohttp", "httpx2", "requests"])
def test_each_request_is_printed_as_it_finishes_and_ctrl_c_reports_what_finished(
    client: str,
) -> None:
    """On a terminal: request #1's block appears while the run goes on (30 requests of 0.4 s
    each); SIGINT then stops it: the percentiles and findings of the requests that finished,
    "interrupted" on stderr, exit code 130. None of the last requests was reached."""
    with mock_server("--ttfb", "0.4", "--tokens", "1") as mock:
        master, slave = pty.openpty()
        process = subprocess.Popen(
            [*CLI, "probe", mock.url, "-n", "30", "--client", client],
            stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE, text=True,
            env=environment(COLUMNS="100"), preexec_fn=as_a_terminals_job,
        )  # fmt: skip
        os.close(slave)
        try:
            first = read_until(master, re.compile(r"#\d+ 200 .*\n(?:.*\n)*?  first byte .*\n"))
            assert process.poll() is None, "the first block came only at the end"
            process.send_signal(signal.SIGINT)
            out = first + read_rest(master)
            _, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
            os.close(master)
    assert process.returncode == 130, err
    assert err.strip().splitlines() == ["llm-latency: interrupted"], err
    assert "Traceback" not in out
    printed = sorted(int(n) for n in re.findall(r"^#(\d+) 200 ", out, re.MULTILINE))
    assert printed, out
    assert 30 not in printed  # stopped before the last request finished
    assert len(printed) == len(set(printed))
    requests = f"{len(printed)} request" + ("s" if len(printed) > 1 else "")
    assert f"percentiles, 2xx: {requests} (200: {len(printed)})" in out, out
    assert "interrupted: the summary of the" in out
    assert re.search(r"^findings", out, re.MULTILINE), out


def test_jsonl_prints_a_line_per_request_as_it_finishes_then_a_summary() -> None:
    with mock_server("--ttfb", "0.3", "--tokens", "1") as mock:
        process = subprocess.Popen(
            [*CLI, "probe", mock.url, "-n", "8", "--jsonl"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(),
        )  # fmt: skip
        assert process.stdout is not None
        first_text = process.stdout.readline()
        first = json.loads(first_text)
        still_running = process.poll() is None
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert still_running, "the first line came only at the end"
    lines = [first, *(json.loads(line) for line in out.splitlines())]
    assert [line["type"] for line in lines] == ["request"] * 8 + ["summary"]
    assert sorted(line["number"] for line in lines[:8]) == list(range(1, 9))
    assert all(line["status"] == 200 and "wait" in line["phases"] for line in lines[:8])
    summary = lines[-1]
    assert "requests" not in summary
    assert summary["summary_by_status"]["2xx"]["requests"] == 8
    # The server answers 0.3 s after it read the request: sending and waiting last that long
    # (the wait alone can end up a little shorter when the process is descheduled between
    # writing the request and noting the send's end).
    assert min(line["phases"]["send"] + line["phases"]["wait"] for line in lines[:8]) >= 0.299
    assert list(summary["findings"]) == [mock.url]
    assert "interrupted" not in summary
    # Numbers rounded to the nanosecond, not 0.30391636974999997.
    numbers = re.findall(r"\d+\.(\d+)", first_text + out)
    assert numbers and max(len(decimals) for decimals in numbers) <= 9


def test_jsonl_on_sigint_ends_with_the_summary_of_what_finished() -> None:
    with mock_server("--ttfb", "0.3", "--tokens", "1") as mock:
        process = subprocess.Popen(
            [*CLI, "probe", mock.url, "-n", "40", "--jsonl"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(),
            preexec_fn=as_a_terminals_job,
        )  # fmt: skip
        assert process.stdout is not None
        first = [json.loads(process.stdout.readline()) for _ in range(2)]
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    lines = [*first, *(json.loads(line) for line in out.splitlines())]
    requests, summary = lines[:-1], lines[-1]
    assert {line["type"] for line in requests} == {"request"}
    assert 2 <= len(requests) < 40
    assert summary["type"] == "summary"
    assert summary["interrupted"] is True
    assert summary["summary_by_status"]["2xx"]["requests"] == len(requests)


# -- --timeout: one deadline per request, whatever the client -------------------------------


@pytest.mark.parametrize("client", ["aiohttp", "httpx2", "requests"])
def test_timeout_is_a_deadline_for_the_whole_stream_with_every_client(client: str) -> None:
    """A stream of 10 tokens at 5 per second lasts about 1.85 s, each pause 0.2 s: a per-read
    timeout of 1 s would let it pass. Under every client, --timeout 1 stops it in the receive
    phase after about 1 s, and --timeout 10 lets it finish."""
    args = ("--stream", "--client", client, "--json")
    with mock_server("--ttfb", "0.05", "--tokens", "10", "--tokens-per-second", "5") as mock:
        short = run_cli("probe", mock.url, "--timeout", "1", *args)
        long = run_cli("probe", mock.url, "--timeout", "10", *args)
    assert short.returncode == 1
    assert "timed out" in short.stderr and "Traceback" not in short.stderr
    (cut,) = json.loads(short.stdout)["requests"]
    assert cut["status"] == 200 and cut["failed_phase"] == "receive" and cut["error"]
    assert 0.9 <= cut["total"] < 1.85, cut
    assert long.returncode == 0, long.stderr
    (whole,) = json.loads(long.stdout)["requests"]
    assert whole["error"] is None and whole["stream_events"] == 12  # 10 tokens, finish, [DONE]
    assert whole["total"] > 1.8 - 0.01


def test_timeout_help_says_what_it_means() -> None:
    out = " ".join(run_cli("probe", "--help").stdout.split())
    assert "Deadline of each request" in out
    assert "to its last byte, streamed or not; the same for every client" in out


# -- what the numbers say -----------------------------------------------------------------------


def test_no_first_byte_for_a_request_that_timed_out_waiting() -> None:
    with mock_server("--ttfb", "3", "--tokens", "1") as mock:
        result = run_cli("probe", mock.url, "--timeout", "0.5")
        report = json.loads(run_cli("probe", mock.url, "--timeout", "0.5", "--json").stdout)
    assert result.returncode == 1
    assert "failed in wait" in result.stdout
    assert "first byte" not in result.stdout
    assert re.search(r"^  end \d+ ms$", result.stdout, re.MULTILINE), result.stdout
    (request,) = report["requests"]
    assert request["failed_phase"] == "wait"
    assert report["summary"] == {}  # nothing succeeded
    assert report["summary_by_status"]["failed"]["requests"] == 1


def test_percentiles_per_status_class() -> None:
    """Two 429s answered at once and two 200s after 0.2 s: the successes' wait p50 is 0.2 s,
    not the 0.1 s of all four mixed; each class has its own table and counts."""
    with mock_server("--ttfb", "0.2", "--tokens", "1", "--rate-limit-every", "2") as mock:
        report = probe_json(mock.url, "-n", "4", exit_code=3)  # the 429s failed
        text = run_cli("probe", mock.url, "-n", "4", env={"COLUMNS": "100"})
    by_status = report["summary_by_status"]
    assert isinstance(by_status, dict)
    assert set(by_status) == {"2xx", "4xx"}
    assert by_status["2xx"]["requests"] == 2 and by_status["2xx"]["statuses"] == {"200": 2}
    assert by_status["4xx"]["requests"] == 2 and by_status["4xx"]["statuses"] == {"429": 2}
    assert by_status["4xx"]["phases"]["wait"]["p50"] < 0.2
    summary = report["summary"]
    assert isinstance(summary, dict)
    waits = [r["phases"]["wait"] for r in report["requests"] if r["status"] == 200]
    assert summary["wait"]["p50"] == pytest.approx(statistics.median(waits), abs=1e-9)  # 2xx only
    assert summary["total"]["p50"] >= 0.2 - 0.005
    assert text.returncode == 3, text.stderr
    assert "percentiles, 2xx: 2 requests (200: 2)" in text.stdout
    assert "percentiles, 4xx: 2 requests (429: 2)" in text.stdout


def test_a_server_that_reports_more_than_the_wait_gets_a_note() -> None:
    """openai-processing-ms says 5 s for an answer sent at once: the overhead is negative, and
    the text says why instead of showing a bare negative number."""
    answer = response(headers=[b"Content-Type: application/json",
                               b"openai-processing-ms: 5000"], body=b"{}")  # fmt: skip
    with RawServer(answer) as server:
        result = run_cli("probe", server.url(), env={"COLUMNS": "120"})
        report = probe_json(server.url())
    assert result.returncode == 0, result.stderr
    (request,) = report["requests"]
    assert request["network_overhead"] < -4.5
    assert re.search(rf"network\+edge -[45]\.\d\d s \({CLOCK_NOTE}\)", result.stdout)


def test_a_refusal_s_zero_server_time_reads_below_a_millisecond() -> None:
    """A 429 sent at once with ``openai-processing-ms: 0``: the header counts whole ms, so its
    0 is "<1 ms", never "0 µs"."""
    answer = response(b"HTTP/1.1 429 Too Many Requests", headers=[
        b"Content-Type: application/json", b"openai-processing-ms: 0"], body=b"{}")  # fmt: skip
    with RawServer(answer) as server:
        result = run_cli("probe", server.url(), env={"COLUMNS": "120"})
    assert result.returncode == 1, result.stderr  # its only request got a 429
    assert "server <1 ms" in result.stdout
    assert "server 0 µs" not in result.stdout


# -- layout --------------------------------------------------------------------------------------


HEADINGS = re.compile(
    r"#\d+ |http://|percentiles|findings|endpoints compared|\d+ requests? with |[┏┃┡│└]"
    r"|Fastest|main finding|No endpoint"
)


@pytest.mark.parametrize("width", [60, 80, 160, 200])
def test_text_fits_the_terminal_width(width: int) -> None:
    """Two endpoints (one streaming, one answering every other request with 429) at 60 to
    200 columns: no line wider than the terminal, nothing cut short with an ellipsis, no
    number parted from its unit, continuation lines indented; the comparison names the
    endpoints #1 and #2 and maps them to their URLs under the table."""
    with mock_server("--ttfb", "0.02", "--tokens", "3", "--tokens-per-second", "100") as a, \
            mock_server("--ttfb", "0.01", "--tokens", "2", "--rate-limit-every", "2") as b:  # fmt: skip
        result = run_cli("probe", a.url, b.url + "?api_key=sk-secret-value", "-n", "3",
                         "--stream", env={"COLUMNS": str(width)})  # fmt: skip
    assert result.returncode == 3, result.stderr  # the 429s
    out = result.stdout
    lines = out.splitlines()
    assert all(cell_len(line) <= width for line in lines), max(lines, key=cell_len)
    assert "…" not in out
    assert "\xa0" not in out  # a number and its unit: a plain space (grep finds "452 ms")
    assert re.search(r"\d ms", out)
    for above, below in itertools.pairwise(lines):
        assert not (re.search(r"\d$", above.rstrip()) and re.match(rf"\s*{UNIT}\b", below))
    for line in lines:
        assert not line or line[0] == " " or HEADINGS.match(line), line
    if width <= 80:  # facts wrapped, with an indent
        assert any(re.match(r"    \S", line) for line in lines), out
    assert re.search(r"┃\s+┃\s+#1 ┃\s+#2 ┃", out)
    assert f"#1 {a.url}" in out
    if width >= 80:
        assert f"#2 {b.url}?api_key=REDACTED" in out
    assert "sk-secret-value" not in out


def test_findings_lines_wrap_with_an_indent_and_say_none_briefly() -> None:
    assert [line.plain for line in findings_lines([], 60)] == [
        "findings: none, nothing to change on this side was found"
    ]


# -- findings ------------------------------------------------------------------------------------


def test_findings_name_new_connections_for_fresh_connections() -> None:
    with mock_server("--tls", "--tls-delay", "0.05", "--ttfb", "0.01", "--tokens", "1") as mock:
        assert mock.ca_file is not None
        args = (mock.url, "--cacert", mock.ca_file, "-n", "4")
        fresh = probe_json(*args, "--fresh")
        pooled = probe_json(*args)
        text = run_cli("probe", *args, "--fresh", env={"COLUMNS": "100"})
    findings = fresh["findings"]
    assert isinstance(findings, dict) and list(findings) == [mock.url]
    (found,) = [f for f in findings[mock.url] if f["rule"] == "new-connections"]
    assert found["evidence"]["count"] == 3  # three of four could have reused the first's
    # the TLS handshake each paid again, less what the loop's stall was charged with
    lag = max(request["event_loop_lag"] or 0.0 for request in fresh["requests"])
    assert found["saving"]["p50"] >= 0.05 - 0.005 - lag
    assert found["fix"] and found["cause"]
    pooled_findings = pooled["findings"]
    assert isinstance(pooled_findings, dict)
    assert "new-connections" not in [f["rule"] for f in pooled_findings[mock.url]]
    assert text.returncode == 0, text.stderr
    block = text.stdout[text.stdout.index("\nfindings\n") :]
    assert re.search(r"^  \d\. new-connections: 3 of 3 requests", block, re.MULTILINE), block
    assert re.search(r"^     fix: reuse one client", block, re.MULTILINE), block
    assert "saves about" in block


# -- input errors, checked before anything is sent ------------------------------------------------


def test_dns_server_must_be_an_ip_and_port() -> None:
    for bad in ("nonsense", "127.0.0.1:99999", "[::1", "example.com:53"):
        line = one_error_line(run_cli("probe", "--dns", bad, "http://127.0.0.1:9/"))
        assert "--dns" in line and "HOST[:PORT]" in line and "AresError" not in line


def test_stream_with_a_body_that_is_not_a_json_object() -> None:
    for body in ("{bad", "[1, 2]"):
        line = one_error_line(run_cli("probe", "-d", body, "--stream", "http://127.0.0.1:9/"))
        assert "--stream" in line and "not" in line


def test_html_into_a_missing_directory_fails_before_the_run() -> None:
    refused = f"http://127.0.0.1:{unused_port()}/v1/chat/completions"
    line = one_error_line(run_cli("probe", refused, "--html", "/nonexistent/dir/x.html"))
    assert "cannot write /nonexistent/dir/x.html" in line  # not "connection refused"


def test_json_and_jsonl_together() -> None:
    result = run_cli("probe", "--json", "--jsonl", "http://127.0.0.1:9/")
    assert result.returncode == 2
    assert "--json and --jsonl" in one_error_line(result)


# -- exit codes: a request that failed is a failure, however it failed ---------------------------


def test_a_run_whose_every_request_failed_exits_1_whatever_the_failure() -> None:
    """Every request refused, answered 404, or answered 429: no successful answer, so the run
    failed (exit code 1), and stderr says what came back."""
    refused = f"http://127.0.0.1:{unused_port()}/v1/chat/completions"
    with mock_server("--ttfb", "0", "--tokens", "1", "--rate-limit-every", "1") as mock:
        missing = run_cli("probe", mock.url.replace("/chat/completions", "/nothing"), "-n", "3")
        limited = run_cli("probe", mock.url, "-n", "2", "--json")
    assert "connection refused" in one_error_line(run_cli("probe", refused, "-n", "2"))
    line = one_error_line(missing)
    assert "/v1/nothing: 3 of 3 requests got an error status (404: 3)" in line, line
    line = one_error_line(limited)
    assert "2 of 2 requests got an error status (429: 2)" in line, line
    assert [r["status"] for r in json.loads(limited.stdout)["requests"]] == [429, 429]


def test_a_run_where_some_requests_failed_exits_3() -> None:
    """A 429 every second request: each answer measured and reported, the run's output whole,
    and exit code 3 (some requests failed, none of the URLs failed outright), with a line on
    stderr; a URL that never answered beside one that did makes the run fail (exit code 1)."""
    refused = f"http://127.0.0.1:{unused_port()}/v1/chat/completions"
    with mock_server("--ttfb", "0", "--tokens", "1", "--rate-limit-every", "2") as mock:
        partly = run_cli("probe", mock.url, "-n", "4", "--json")
        with mock_server("--ttfb", "0", "--tokens", "1") as healthy:
            beside = run_cli("probe", healthy.url, refused, "-n", "2")
    assert partly.returncode == 3, partly.stderr
    assert "2 of 4 requests got an error status (429: 2)" in one_error_line(partly)
    statuses = sorted(r["status"] for r in json.loads(partly.stdout)["requests"])
    assert statuses == [200, 200, 429, 429]
    assert beside.returncode == 1, beside.stderr
    assert "connection refused" in one_error_line(beside)


@pytest.mark.parametrize("mode", ["text", "jsonl"])
def test_output_piped_into_head(mode: str) -> None:
    """``llm-latency probe ... | head -1``: the first line, then the probe stops quietly with
    the exit code of a process killed by SIGPIPE (141), no error on stderr."""
    with mock_server("--ttfb", "0.1", "--tokens", "1") as mock:
        probe = subprocess.Popen(
            [*CLI, "probe", mock.url, "-n", "20", *(["--jsonl"] if mode == "jsonl" else [])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment(),
        )  # fmt: skip
        assert probe.stdout is not None
        head = subprocess.run(["head", "-1"], stdin=probe.stdout, capture_output=True,
                              timeout=60, check=True)  # fmt: skip
        probe.stdout.close()
        _, err = probe.communicate(timeout=60)
    assert len(head.stdout.splitlines()) == 1
    assert probe.returncode == 141, err
    assert err == b""


# -- mock-server -----------------------------------------------------------------------------------


def test_mock_server_logs_a_client_that_hangs_up_in_one_line() -> None:
    with mock_server("--ttfb", "0", "--tokens", "100", "--tokens-per-second", "20") as mock:
        port = int(mock.url.split(":")[2].split("/")[0])
        body = b'{"model": "m", "stream": true, "messages": []}'
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
            received = b""
            while b"data: " not in received:
                received += sock.recv(65536)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        assert mock.process.stderr is not None
        log = mock.process.stderr.readline()  # blocks until the server notices
        mock.process.send_signal(signal.SIGINT)
        _, rest = mock.process.communicate(timeout=10)
    assert "hung up mid-stream" in log and "of 100 chunks" in log, log
    assert rest == "", rest
    assert "Traceback" not in log + rest
    assert mock.process.returncode == 0
