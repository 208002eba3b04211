"""The findings page of ``llm-latency advise`` in a real headless Chromium (Debian's package,
driven by Playwright as tests/test_html_report.py drives it): it renders each finding with its
fix and saving, and every link on it works: a service's and a host's own view, the JSON, the
metrics, back to all services."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import aiohttp
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from playwright.sync_api import Browser

import llm_latency
from llm_latency.advise import AdviseServer, Advisor, Settings
from llm_latency.diagnosis.records import from_readable_spans
from tests import test_html_report
from tests.servers import llm_server

LIMITED, POOLED = "checkout", "search"
FIX = "aiohttp.TCPConnector(limit=30, limit_per_host=30)"
#: Debian's chromium, launched as tests/test_html_report.py launches it.
browser = test_html_report.browser


async def burst(limit_per_host: int) -> None:
    async with llm_server() as server:
        connector = aiohttp.TCPConnector(limit_per_host=limit_per_host)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one() -> None:
                async with session.post(server.url(wait=0.2), json={}) as response:
                    await response.read()

            await asyncio.gather(*(one() for _ in range(30)))


def spans_of(service: str, limit_per_host: int) -> list[object]:
    """The spans of the seed's burst through a pool of ``limit_per_host``, as ``service``."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    llm_latency.instrument(
        tracer_provider=provider, meter_provider=MeterProvider(), configure=False
    )
    try:
        asyncio.run(burst(limit_per_host))
    finally:
        llm_latency.uninstrument()
    return list(memory.get_finished_spans())


@pytest.fixture(scope="module")
def advise() -> Iterator[AdviseServer]:
    advisor = Advisor(Settings(settle=0.0, interval=3600))
    advisor.receive(from_readable_spans(spans_of(LIMITED, 5)))
    advisor.receive(from_readable_spans(spans_of(POOLED, 30)))
    advisor.run_diagnosis(everything=True)
    server = AdviseServer(("127.0.0.1", 0), advisor)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_the_page_renders_the_findings_and_every_link_works(
    advise: AdviseServer, browser: Browser
) -> None:
    page = browser.new_page()
    failed: list[str] = []
    page.on("requestfailed", lambda request: failed.append(request.url))
    assert page.goto(f"{advise.url}/").status == 200  # type: ignore[union-attr]

    rows = page.locator("tr.finding")
    rules = [rows.nth(i).get_attribute("data-rule") for i in range(rows.count())]
    assert "pool-queue" in rules
    pool = page.locator('tr.finding[data-rule="pool-queue"]')
    assert pool.locator("a.service").inner_text() == LIMITED
    assert pool.locator("a.host").inner_text() == "127.0.0.1"
    assert FIX in pool.locator("td.fix").inner_text()
    assert "of the calls' time" in pool.inner_text() and "saves about" in pool.inner_text()
    assert pool.locator("td.fix").is_visible()
    windows = page.locator("ul#windows a.window").all_inner_texts()
    assert sorted(windows) == [f"{LIMITED} → 127.0.0.1", f"{POOLED} → 127.0.0.1"]
    # The healthy service has no finding with a saving: no pool-queue row of its own.
    assert (
        page.locator(
            f'tr.finding:has(a.service:text-is("{POOLED}"))[data-rule="pool-queue"]'
        ).count()
        == 0
    )

    # A service's link: its own view, only its findings.
    pool.locator("a.service").click()
    page.wait_for_load_state()
    assert page.url == f"{advise.url}/?service={LIMITED}"
    assert page.title() == f"llm-latency findings of {LIMITED}"
    services = set(page.locator("tr.finding a.service").all_inner_texts())
    assert services == {LIMITED}

    # A host's link: the service's calls to that host.
    page.locator('tr.finding[data-rule="pool-queue"] a.host').click()
    page.wait_for_load_state()
    assert page.url == f"{advise.url}/?service={LIMITED}&host=127.0.0.1"
    assert FIX in page.locator('tr.finding[data-rule="pool-queue"] td.fix').inner_text()

    # The JSON of this view: the same finding, its fix and its saving.
    page.locator("a#json").click()
    page.wait_for_load_state()
    assert page.url == f"{advise.url}/findings.json?service={LIMITED}&host=127.0.0.1"
    data = json.loads(page.locator("body").inner_text())
    (listed,) = [f for f in data["findings"] if f["rule"] == "pool-queue"]
    assert FIX in listed["finding"]["fix"] and listed["saving_ratio"] > 0
    page.go_back()

    # The metrics, and back to every service.
    page.locator("a#metrics").click()
    page.wait_for_load_state()
    assert page.url == f"{advise.url}/metrics"
    assert f'llm_latency_advice_saving_ratio{{service="{LIMITED}"' in page.content()
    page.go_back()
    page.locator("a#all").click()
    page.wait_for_load_state()
    assert page.url == f"{advise.url}/"

    # Every link of the page answers.
    hrefs = page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)")
    assert len(hrefs) >= 7
    for href in hrefs:
        assert page.request.get(href).status == 200, href
    assert failed == []


def test_a_service_without_findings_says_so(advise: AdviseServer, browser: Browser) -> None:
    page = browser.new_page()
    page.goto(f"{advise.url}/?service=nobody")
    assert page.locator("p#none").is_visible()
    assert page.locator("tr.finding").count() == 0
