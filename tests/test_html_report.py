"""``probe --html``, read in real headless Chromium (Debian's, driven by Playwright): reports
made by real probe runs against the mock server (a 429, a 500, a timeout, a refused port, four
URLs, ``--fresh``; a pooled streamed run), and one from the OpenAI SDK's own retries.

Each test makes its own report and reads it at 1280 and at 800 px. Layout, not pixels: every
text fragment's box, read from the page, must not overlap another, must stay inside its element
and its row; bars must lie on their chart's axis; the page must not scroll sideways. The drawn
bars are checked against the probe's own ``--json`` numbers through the axis' labels, so a
wrong scale or a wrong label fails too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import openai
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from llm_latency.cli.html_report import RunDetails, html_page
from llm_latency.cli.results import to_results
from llm_latency.cli.rhythm import decode_speed
from llm_latency.diagnosis import diagnose
from llm_latency.diagnosis.findings import duration
from tests.command_line import mock_server, run_cli_process
from tests.conftest import Telemetry
from tests.servers import unused_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
WIDTHS = (1280, 800)
# Layout tolerance: a pixel, and one unit of the 1/64 px grid Chromium lays boxes out on (the bar
# and the axis it is measured against are each snapped to it).
PX = 1.0 + 1 / 64
USER, PASSWORD, API_KEY, HEADER_SECRET = (
    "rep-user-51c2",
    "rep-pw-8e0d",
    "rep-ak-77a1",
    "sk-rep-3b9f",
)


@dataclass
class Report:
    path: Path
    data: dict[str, Any]  # the same run's --json


# The probes run as processes of their own: Playwright's event loop runs in this one.


def mixed_run(folder: Path) -> Report:
    """Four endpoints, --fresh, written as --html and --json at once: a 429 every second
    request, a seeded 500, a server slower than --timeout, a refused port."""
    refused = f"http://127.0.0.1:{unused_port()}/v1/chat/completions"
    with mock_server("--ttfb", "0.2", "--tokens", "1", "--rate-limit-every", "2") as limited, \
            mock_server("--ttfb", "0.05", "--tokens", "1", "--error-rate", "0.5", "--seed", "1") as flaky, \
            mock_server("--ttfb", "6", "--tokens", "1") as slow:  # fmt: skip
        secret_url = (  # long, as real deployment URLs are: it must wrap, not widen the page
            limited.url.replace("://", f"://{USER}:{PASSWORD}@")
            + f"?api_key={API_KEY}&api-version=2024-10-21-preview&deployment=team-a-gpt-4o-mini"
        )
        page = folder / "mixed.html"
        result = run_cli_process("probe", "--json", "--html", str(page), "-n", "3", "--fresh",
                         "--timeout", "2", "-H", f"X-Api-Key: {HEADER_SECRET}",
                         secret_url, flaky.url, slow.url, refused)  # fmt: skip
    assert result.returncode == 1, result.stderr  # the timeouts and the refusals
    return Report(page, json.loads(result.stdout))


def pooled_run(folder: Path) -> Report:
    """One endpoint, five sequential streamed requests on one connection."""
    with mock_server("--ttfb", "0.1", "--tokens", "3", "--tokens-per-second", "50") as mock:
        page = folder / "pooled.html"
        result = run_cli_process(
            "probe", "--json", "--html", str(page), "-n", "5", "--stream", mock.url
        )
    assert result.returncode == 0, result.stderr
    return Report(page, json.loads(result.stdout))


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@contextmanager
def opened(browser: Browser, path: Path, width: int) -> Iterator[tuple[Page, list[str]]]:
    """The report in a fresh page ``width`` px wide, and every URL the page requested."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(path.as_uri())
    try:
        yield page, requested
    finally:
        context.close()


# -- reading the page -----------------------------------------------------------------------------

#: Every text fragment (one box per line of each text node) with its element's box and the
#: index of its row (.wr or tr); every chart's axes, tracks and bars; the sections' boxes.
LAYOUT_JS = """() => {
  const box = (el) => { const r = el.getBoundingClientRect();
                        return {x: r.left, y: r.top, r: r.right, b: r.bottom}; };
  const rows = Array.from(document.querySelectorAll('.wr, tr'));
  const texts = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.textContent.trim()) continue;
    const parent = node.parentElement;
    const row = parent.closest('.wr, tr');
    let block = parent;  // the box the text must stay in: its nearest non-inline element
    while (getComputedStyle(block).display === 'inline') block = block.parentElement;
    const range = document.createRange();
    range.selectNodeContents(node);
    for (const r of range.getClientRects()) {
      if (r.width === 0 || r.height === 0) continue;
      texts.push({t: node.textContent.trim().slice(0, 50), x: r.left, y: r.top, r: r.right,
                  b: r.bottom, own: box(block), row: row ? rows.indexOf(row) : -1});
    }
  }
  const charts = Array.from(document.querySelectorAll('.wf, table.chart')).map(chart => ({
    name: chart.className,
    axes: Array.from(chart.querySelectorAll('.axis')).map(axis => ({
      box: box(axis),
      marks: Array.from(axis.querySelectorAll('.tm')).map(box),
      ticks: Array.from(axis.querySelectorAll('.tick')).map(box)})),
    tracks: Array.from(chart.querySelectorAll('.track')).map(track => ({
      box: box(track), bars: Array.from(track.querySelectorAll('.seg, .env')).map(box)})),
  }));
  const first = (selector) => { const el = document.querySelector(selector);
                                return el ? box(el) : null; };
  return {scroll: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
          texts, rows: rows.map(box), charts, findings: first('#findings'),
          waterfall: first('.wf')};
}"""

#: Per waterfall: its axis (box, ticks with their time and label, marks) and each row's
#: classes, texts, colours and bars.
WATERFALLS_JS = """() => Array.from(document.querySelectorAll('.wf')).map(wf => {
  const axis = wf.querySelector('.axis');
  const a = axis.getBoundingClientRect();
  const bar = (el) => { const r = el.getBoundingClientRect(); return {x: r.left, w: r.width}; };
  return {
    endpoint: wf.dataset.endpoint,
    axis: {x: a.left, w: a.width},
    ticks: Array.from(axis.querySelectorAll('.tick')).map(t => [parseFloat(t.dataset.s),
                                                                t.textContent]),
    marks: Array.from(axis.querySelectorAll('.tm')).map(m => m.getBoundingClientRect().left),
    rows: Array.from(wf.querySelectorAll('.wr:not(.axis-row)')).map(row => ({
      cls: Array.from(row.classList), label: row.querySelector('.wl').innerText,
      total: row.querySelector('.wv').textContent,
      note: row.querySelector('.note') ? row.querySelector('.note').textContent : null,
      facts: row.querySelector('.facts') ? row.querySelector('.facts').textContent : null,
      background: getComputedStyle(row).backgroundColor,
      env: row.querySelector('.env') ? bar(row.querySelector('.env')) : null,
      segs: Array.from(row.querySelectorAll('.seg')).map(s => ({
        phase: s.dataset.phase || null, failed: s.classList.contains('failed'), ...bar(s)})),
    })),
  };
})"""

#: Per percentile chart (table.pct): its axis and, per row, the name, bars and numbers.
PERCENTILES_JS = """() => Array.from(document.querySelectorAll('table.pct')).map(table => {
  const axis = table.querySelector('tfoot .axis');
  const a = axis.getBoundingClientRect();
  const width = (el) => el.getBoundingClientRect().width;
  return {
    axis: {x: a.left, w: a.width},
    ticks: Array.from(axis.querySelectorAll('.tick')).map(t => [parseFloat(t.dataset.s),
                                                                t.textContent]),
    marks: Array.from(axis.querySelectorAll('.tm')).map(m => m.getBoundingClientRect().left),
    rows: Array.from(table.querySelectorAll('tbody tr')).map(tr => ({
      name: tr.querySelector('.name').textContent,
      p50: width(tr.querySelector('.p50')), p95: width(tr.querySelector('.p95')),
      cells: Array.from(tr.querySelectorAll('td.v')).map(td => td.textContent)})),
  };
})"""


def overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return min(a["r"], b["r"]) - max(a["x"], b["x"]) > PX and \
        min(a["b"], b["b"]) - max(a["y"], b["y"]) > PX  # fmt: skip


def inside(a: dict[str, float], outer: dict[str, float], slack: float = PX) -> bool:
    return (a["x"] >= outer["x"] - slack and a["r"] <= outer["r"] + slack
            and a["y"] >= outer["y"] - slack and a["b"] <= outer["b"] + slack)  # fmt: skip


def assert_layout(page: Page) -> dict[str, Any]:
    """No text over another, none out of its element or row, bars on their axis, no sideways
    scrolling, the findings above the waterfalls. Returns what it read."""
    layout: dict[str, Any] = page.evaluate(LAYOUT_JS)
    scroll_width, client_width = layout["scroll"]
    assert scroll_width <= client_width, (
        f"the page scrolls sideways: {scroll_width} > {client_width}"
    )
    texts = sorted(layout["texts"], key=lambda t: t["y"])
    assert len(texts) > 50
    for i, text in enumerate(texts):
        assert inside(text, text["own"]), f"{text['t']!r} spills out of its element"
        if text["row"] >= 0:
            assert inside(text, layout["rows"][text["row"]]), f"{text['t']!r} out of its row"
        for other in texts[i + 1 :]:
            if other["y"] >= text["b"] - PX:
                break
            assert not overlap(text, other), f"{text['t']!r} overlaps {other['t']!r}"
    assert layout["charts"], "no chart"
    for chart in layout["charts"]:
        axes = chart["axes"]
        assert axes, chart["name"]
        for axis in axes:
            assert abs(axis["box"]["x"] - axes[0]["box"]["x"]) <= PX
            assert abs(axis["box"]["r"] - axes[0]["box"]["r"]) <= PX
            assert all(inside(mark, axis["box"]) for mark in axis["marks"]), chart["name"]
            assert all(inside(tick, axis["box"]) for tick in axis["ticks"]), chart["name"]
        axis_box = axes[0]["box"]
        for track in chart["tracks"]:  # every track spans its chart's axis exactly
            assert abs(track["box"]["x"] - axis_box["x"]) <= PX, chart["name"]
            assert abs(track["box"]["r"] - axis_box["r"]) <= PX, chart["name"]
            for bar in track["bars"]:
                assert inside(bar, track["box"]), f"a bar off its track in {chart['name']}"
    assert layout["findings"] is not None and layout["waterfall"] is not None
    assert layout["findings"]["b"] <= layout["waterfall"]["y"], "findings after the waterfalls"
    return layout


def seconds(label: str) -> float:
    """An axis label back to seconds: ``0``, ``250 ms``, ``1.5 s``."""
    number, _, unit = label.replace("\u00a0", " ").partition(" ")
    return float(number) * {"": 1.0, "s": 1.0, "ms": 1e-3}[unit]


def scale(axis: dict[str, float], ticks: list[list[Any]], marks: list[float]) -> float:
    """Pixels per second of an axis, from its labels; each label is checked against its time
    and against where its mark is drawn."""
    for value, label in ticks:
        assert seconds(label) == pytest.approx(value, rel=1e-6, abs=1e-12), label
    end = ticks[-1][0]
    assert ticks[0][0] == 0 and end > 0
    per_second = axis["w"] / end
    for mark, (value, _) in zip(marks, ticks, strict=True):
        assert abs(mark - (axis["x"] + value * per_second)) <= 1.5, (value, mark)
    return float(per_second)


def drawn(length: float, per_second: float) -> float:
    """The width a bar of ``length`` seconds should have: at least 2 px."""
    return max(length * per_second, 2.0)


def assert_rows_match(waterfalls: list[dict[str, Any]], requests: list[dict[str, Any]]) -> None:
    """Each request row says and draws what the run's --json measured: status, connection,
    total, failed phase, and every bar's length and place on the axis."""
    rows = [(wf, row) for wf in waterfalls for row in wf["rows"] if "backoff" not in row["cls"]]
    assert len(rows) == len(requests)
    number: dict[str, int] = {}
    for (wf, row), request in zip(rows, requests, strict=True):
        per_second = scale(wf["axis"], wf["ticks"], wf["marks"])
        number[wf["endpoint"]] = number.get(wf["endpoint"], 0) + 1
        label = row["label"]
        assert f"#{number[wf['endpoint']]}" in label
        status = request["status"]
        assert str(status if status is not None else "failed") in label
        assert {False: "new conn", True: "pooled", None: ""}[request["reused"]] in label
        assert row["total"] == duration(request["total"])
        axis_x = wf["axis"]["x"]
        env = row["env"]
        assert (
            abs(env["x"] - (axis_x + min(request["start"] * per_second, wf["axis"]["w"] - 2))) <= PX
        )
        assert abs(env["w"] - drawn(request["total"], per_second)) <= PX
        phases = {seg["phase"]: seg for seg in row["segs"]}
        assert set(phases) == set(request["phases"])
        for name, length in request["phases"].items():
            assert abs(phases[name]["w"] - drawn(length, per_second)) <= PX, name
            assert env["x"] - PX <= phases[name]["x"] <= env["x"] + env["w"] + PX, name
        if request["error"]:
            assert row["note"] is not None
            assert f"failed in {request['failed_phase']}: {request['error']}" in row["note"]
            assert [s["phase"] for s in row["segs"] if s["failed"]] == [request["failed_phase"]]
            assert "ofailed" in row["cls"]
        if status == 429:
            assert "o429" in row["cls"] and "rate-limited, retry after" in row["note"]
        if status is not None and status >= 500:
            assert "o5xx" in row["cls"] and f"server error {status}" in row["note"]
        highlighted = status is None or status == 429 or status >= 500
        plain = row["background"] in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)")
        assert plain != highlighted, (status, row["background"])


def assert_self_contained(text: str, requested: list[str], path: Path) -> None:
    assert "<script" not in text.lower()
    assert not re.search(r"""(?i)\b(src|href)\s*=\s*["']?\s*(https?:)?//""", text)
    assert not re.search(r"(?i)url\(\s*[\"']?\s*(https?:)?//", text)
    assert "@import" not in text
    assert requested == [path.as_uri()], requested  # nothing but the file itself


# -- the tests ------------------------------------------------------------------------------------


def test_mixed_run_reads_as_a_report(browser: Browser, tmp_path: Path) -> None:
    """Four endpoints with --fresh: a 429 every second request, a 500, timeouts, a refused
    port. Every row is marked, highlighted and drawn to scale; nothing overlaps."""
    report = mixed_run(tmp_path)
    requests = report.data["requests"]
    by_url: dict[str, list[dict[str, Any]]] = {}
    for request in requests:
        by_url.setdefault(request["url"], []).append(request)
    limited, flaky, slow, refused = by_url.values()  # the run is what this test means
    assert [r["status"] for r in limited] == [200, 429, 200]
    assert 500 in [r["status"] for r in flaky] and 200 in [r["status"] for r in flaky]
    assert [r["failed_phase"] for r in slow] == ["wait"] * 3
    assert [r["failed_phase"] for r in refused] == ["connect"] * 3
    text = report.path.read_text()
    for secret in (USER, PASSWORD, API_KEY, HEADER_SECRET):
        assert secret not in text
    for width in WIDTHS:
        with opened(browser, report.path, width) as (page, requested):
            assert_layout(page)
            assert_self_contained(text, requested, report.path)
            waterfalls = page.evaluate(WATERFALLS_JS)
            assert [wf["endpoint"] for wf in waterfalls] == ["E1", "E2", "E3", "E4"]
            assert_rows_match(waterfalls, requests)
            assert all(r["reused"] is False for r in requests)  # --fresh: a marker on every row
            assert page.locator(".wf .cn.new").count() == len(requests)
            assert page.locator(".wf .cn.pooled").count() == 0
            # The endpoints compared, numbered as the legend says, with the run's own numbers.
            legend = page.locator(".legend-eps li").all_inner_texts()
            assert len(legend) == 4 and all(f"E{i}" in line for i, line in enumerate(legend, 1))
            assert "REDACTED" in legend[0]
            compared = page.locator(".cmp tbody tr")
            assert compared.count() == 4
            endpoints = report.data["endpoints"]
            for i, url in enumerate(endpoints):
                cells = compared.nth(i).locator("td").all_inner_texts()
                assert cells[0] == f"E{i + 1}"
                assert cells[1] == "3"
                if "total" in endpoints[url] or i == 0:  # successes only; E1 has 200s
                    assert duration(endpoints[url]["total"]["p50"]) in cells
            assert "3 failed in connect" in compared.nth(3).inner_text()
            # The run's details, secrets redacted; the findings and conclusion on top.
            details = page.locator("#details").inner_text()
            for word in ("aiohttp", "--requests 3", "--fresh", "--timeout 2.0",
                         "X-Api-Key: REDACTED", "--json", datetime.now().strftime("%Y-%m-")):  # fmt: skip
                assert word in details, word
            assert page.locator("#findings .finding[data-rule='rate-limits']").count() == 1
            conclusion = page.locator(".conclusion").inner_text()
            assert "connection refused" in conclusion and "timed out" in conclusion
            # The fastest answered, but not always (E2, 150 ms sooner than E1 unless the machine
            # was too busy to keep the lead; both failed 1 of 3): the ranking says so, with the
            # failure rate.
            fastest = min(
                (i for i, url in enumerate(endpoints) if "total" in endpoints[url]),
                key=lambda i: endpoints[list(endpoints)[i]]["total"]["p50"],
            )
            assert fastest in (0, 1)
            assert "Fastest successful answers" in conclusion
            assert f"E{fastest + 1} is fastest only when it answers: 33% failed, 1 of 3" in (
                conclusion
            )
            assert "no successful answer from" in conclusion  # E3 timed out, E4 was refused
            failed_column = compared.nth(3).locator("td").all_inner_texts()[3]
            assert failed_column == "100%"


def test_pooled_streamed_run(browser: Browser, tmp_path: Path) -> None:
    """One endpoint, sequential: the first request opens the connection, the others reuse
    it, and the percentile bars are as long as the percentiles, on the chart's own axis."""
    report = pooled_run(tmp_path)
    requests = report.data["requests"]
    assert [r["reused"] for r in requests] == [False, True, True, True, True]
    for width in WIDTHS:
        with opened(browser, report.path, width) as (page, requested):
            assert_layout(page)
            assert_self_contained(report.path.read_text(), requested, report.path)
            waterfalls = page.evaluate(WATERFALLS_JS)
            assert_rows_match(waterfalls, requests)
            assert page.locator(".wf .cn.pooled").count() == 4
            assert page.locator("#compare").count() == 0  # one endpoint: nothing to compare
            (chart,) = page.evaluate(PERCENTILES_JS)
            per_second = scale(chart["axis"], chart["ticks"], chart["marks"])
            summary = report.data["summary"]
            names = [row["name"] for row in chart["rows"]]
            # OpenAI's stream without include_usage: its first token, no time per token.
            assert names[-3:] == ["first chunk", "first token", "total"]
            assert {n.replace(" ", "_") for n in names} == set(summary)
            for row in chart["rows"]:
                numbers = summary[row["name"].replace(" ", "_")]
                assert row["cells"][:3] == [duration(numbers[q]) for q in ("p50", "p95", "max")]
                assert abs(row["p50"] - drawn(numbers["p50"], per_second)) <= PX, row["name"]
                assert abs(row["p95"] - drawn(numbers["p95"], per_second)) <= PX, row["name"]


def test_sdk_retries_show_their_backoff(
    telemetry: Telemetry, browser: Browser, tmp_path: Path
) -> None:
    """The OpenAI SDK's own retry after a 429: the retry.backoff row lies between the 429 and
    the retry, as long as the wait; the findings come out in the engine's order."""
    with mock_server("--ttfb", "0.05", "--tokens", "1", "--rate-limit-every", "2",
                     "--retry-after-ms", "300") as mock:  # fmt: skip
        client = openai.OpenAI(
            base_url=mock.url.removesuffix("/chat/completions"), api_key="sk-x", max_retries=2
        )
        for _ in range(2):  # the second call's first attempt gets the 429
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        client.close()
    spans = telemetry.spans()
    results = to_results(spans)
    findings = diagnose(spans)
    assert [r.kind for r in results] == ["request", "request", "backoff", "request"]
    url = mock.url
    details = RunDetails(datetime.now(timezone.utc), "python sdk_retries.py", "openai (httpx)",
                         2, 1, False, False, 600.0)  # fmt: skip
    path = tmp_path / "retries.html"
    path.write_text(html_page({url: results}, details, {url: findings}), encoding="utf-8")
    for width in WIDTHS:
        with opened(browser, path, width) as (page, requested):
            assert_layout(page)
            assert_self_contained(path.read_text(), requested, path)
            (wf,) = page.evaluate(WATERFALLS_JS)
            per_second = scale(wf["axis"], wf["ticks"], wf["marks"])
            _, limited, backoff, retried = wf["rows"]
            assert "backoff" in backoff["cls"] and backoff["note"] == "waiting after 429"
            assert "o429" in limited["cls"] and "o429" not in retried["cls"]
            (wait,) = backoff["segs"]
            assert abs(wait["w"] - drawn(results[2].total, per_second)) <= PX
            assert wait["w"] >= 0.3 * per_second - PX  # the server's retry-after-ms
            assert limited["env"]["x"] <= wait["x"] <= retried["env"]["x"]
            causes = page.locator("#findings .finding .cause").all_inner_texts()
            assert causes == [f.cause for f in findings]


def test_an_endpoint_with_no_recorded_request(browser: Browser, tmp_path: Path) -> None:
    """aiohttp refuses a URL with credentials and an Authorization header before sending: the
    report still says what happened, with no waterfall to draw and nothing to diagnose."""
    page_file = tmp_path / "nothing.html"
    url = f"http://{USER}:{PASSWORD}@127.0.0.1:{unused_port()}/v1/chat/completions"
    result = run_cli_process(
        "probe", "--html", str(page_file), "-H", f"Authorization: Bearer {HEADER_SECRET}", url
    )
    assert result.returncode == 1
    assert "Cannot combine AUTHORIZATION header" in result.stderr
    text = page_file.read_text()
    for secret in (USER, PASSWORD, HEADER_SECRET):
        assert secret not in text
    with opened(browser, page_file, 800) as (page, requested):
        assert_self_contained(text, requested, page_file)
        assert page.locator(".wf").count() == 0 and page.locator("table.pct").count() == 0
        assert "No request was recorded." in page.locator(".endpoint").inner_text()
        conclusion = page.locator(".conclusion").inner_text()
        assert "0 requests: none recorded." in conclusion
        assert "Cannot combine AUTHORIZATION header" in conclusion
        assert "Authorization: REDACTED" in page.locator("#details").inner_text()
        assert page.evaluate("document.documentElement.scrollWidth") <= 800


def test_a_stream_asked_for_in_the_body(browser: Browser, tmp_path: Path) -> None:
    """A stream asked for by the -d body (with its usage, as docs/cli.md shows), not by
    --stream: the details say the run streamed, and each row says the request's time to first
    token, its tokens in and out and its time per output token, as the run's --json does."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    with mock_server("--ttfb", "0.05", "--tokens", "4", "--tokens-per-second", "50") as mock:
        page_file = tmp_path / "usage.html"
        result = run_cli_process(
            "probe", "--json", "--html", str(page_file), "-n", "3", "-d", json.dumps(body), mock.url
        )
    assert result.returncode == 0, result.stderr
    requests = json.loads(result.stdout)["requests"]
    assert all(r["output_tokens"] == 4 and r["time_per_output_token"] for r in requests)
    for width in WIDTHS:
        with opened(browser, page_file, width) as (page, requested):
            assert_layout(page)
            assert_self_contained(page_file.read_text(), requested, page_file)
            details = dict(
                zip(
                    page.locator("#details th").all_inner_texts(),
                    page.locator("#details td").all_inner_texts(),
                    strict=True,
                )
            )
            assert details["stream"] == "yes"
            (wf,) = page.evaluate(WATERFALLS_JS)
            assert_rows_match([wf], requests)
            for row, request in zip(wf["rows"], requests, strict=True):
                assert row["facts"] == (
                    f"first token {duration(request['time_to_first_token'])}, "
                    f"tokens {request['input_tokens']} in, {request['output_tokens']} out, "
                    f"{decode_speed(request['time_per_output_token'])}"
                )
