"""``llm-latency demo``: the product working, with no API key and no services.

A built-in OpenAI-compatible server over HTTPS (a throwaway certificate, a slow TLS handshake,
a "model" that takes a while before the first token and then streams), a local DNS server that
answers slowly, and five scenes run through instrumented aiohttp clients; the last one reads the
answers' tokens, to tell a slow provider from a long answer.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import Tracer
from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.text import Text

import llm_latency
from llm_latency.cli.pool_view import pool_table, watching
from llm_latency.cli.render import (
    dur,
    make_console,
    print_findings,
    print_trimmed,
    status_tables,
    waterfall,
    wrap,
)
from llm_latency.cli.results import RequestResult, SpanCollector, summarize, to_results
from llm_latency.cli.telemetry import instrumented, otlp_endpoint
from llm_latency.diagnosis import Finding, diagnose
from llm_latency.testing import LocalDNS, Profile, running

HOST = "api.llm-demo.test"
PROFILE = Profile(ttfb=0.25, tokens_per_second=40.0, tokens=40, tls_delay=0.08, retry_after_ms=300)
DNS_DELAY = 0.05
#: The answers' length in the scenes (the server would write PROFILE.tokens), and the long one's.
SHORT, LONG = 8, 40
BODY = {
    "model": "mock-gpt",
    "messages": [{"role": "user", "content": "Say hello."}],
    "max_tokens": SHORT,
}

#: The root span of each scene's trace: a trace list (Jaeger's) tells the scenes apart by it.
SCENE_SPANS = {
    "1a": "demo 1a: a new connection per request",
    "1b": "demo 1b: one pooled session",
    "2a": "demo 2a: an answer without streaming",
    "2b": "demo 2b: a streamed answer",
    "3": "demo 3: a burst through a pool of 2",
    "4": "demo 4: rate-limited, then retried",
    "5": "demo 5: a short and a long answer",
}


@dataclass
class Scene:
    """One scene's requests, what it shows in a sentence, and the diagnosis of its spans."""

    title: str
    results: list[RequestResult]
    closing: str
    findings: list[Finding]
    extra: RenderableType | None = None


class Demo:
    """Runs the scenes against the built-in server and prints them."""

    def __init__(
        self,
        console: Console,
        url: str,
        dns: LocalDNS,
        ssl_context: ssl.SSLContext,
        collector: SpanCollector,
        metrics: InMemoryMetricReader,
        progress: Progress,
        tracer: Tracer,
    ) -> None:
        self.console = console
        self.url = url
        self.dns = dns
        self.ssl_context = ssl_context
        self.collector = collector
        self.metrics = metrics
        self.progress = progress
        self.tracer = tracer

    @contextmanager
    def scene(self, key: str) -> Iterator[None]:
        """The scene's requests go into one trace, under a root span named after the scene."""
        with self.tracer.start_as_current_span(SCENE_SPANS[key]):
            yield

    def session(self, **connector: Any) -> tuple[aiohttp.ClientSession, aiohttp.AsyncResolver]:
        resolver = aiohttp.AsyncResolver(nameservers=[self.dns.nameserver])
        tcp = aiohttp.TCPConnector(ssl=self.ssl_context, resolver=resolver, **connector)
        return aiohttp.ClientSession(connector=tcp), resolver

    async def post(
        self, session: aiohttp.ClientSession, stream: bool = False, body: Any = None, **kw: Any
    ) -> None:
        sent = {**BODY, "stream": stream, **(body or {})}
        async with session.post(self.url, json=sent, **kw) as response:
            async for _ in response.content.iter_any():
                pass

    async def steps(
        self, label: str, count: int, step: Callable[[], Awaitable[None]], concurrent: bool = False
    ) -> None:
        task = self.progress.add_task(label, total=count)

        async def tracked() -> None:
            await step()
            self.progress.advance(task)

        if concurrent:
            await asyncio.gather(*(tracked() for _ in range(count)))
        else:
            for _ in range(count):
                await tracked()
        self.progress.remove_task(task)

    def take(self) -> tuple[list[RequestResult], list[Finding]]:
        """The requests since the last take, and their diagnosis."""
        spans = self.collector.take()
        return to_results(spans), diagnose(spans)

    async def fresh_vs_pooled(self) -> list[Scene]:
        async def fresh() -> None:
            # a client per request, as a program that makes one per call (no force_close:
            # the diagnosis would name that setting instead)
            session, resolver = self.session(use_dns_cache=False)
            async with session:
                await self.post(session)
            await resolver.close()

        with self.scene("1a"):
            await self.steps("fresh connection per request", 4, fresh)
        fresh_results, fresh_findings = self.take()
        with self.scene("1b"):
            session, resolver = self.session()
            async with session:
                await self.steps("one pooled session", 4, lambda: self.post(session))
            await resolver.close()
        pooled, pooled_findings = self.take()
        fresh_p50 = summarize(fresh_results)["total"]["p50"]
        later = summarize(pooled[1:])["total"]["p50"]
        return [
            Scene(
                "1a. A new connection for every request: DNS, TCP and TLS each time",
                fresh_results,
                f"Every request paid for DNS, TCP and TLS: p50 {dur(fresh_p50)}.",
                fresh_findings,
            ),
            Scene(
                "1b. One pooled session: only the first request connects",
                pooled,
                f"Pooling removed DNS, TCP and TLS from every request after the first: "
                f"p50 {dur(later)} against {dur(fresh_p50)}.",
                pooled_findings,
            ),
        ]

    async def streaming(self) -> list[Scene]:
        session, resolver = self.session()
        async with session:
            with self.scene("2a"):
                await self.post(session)  # warm the pool, so the scene compares only the answer
                self.take()
                await self.steps("without streaming", 3, lambda: self.post(session))
            plain, plain_findings = self.take()
            with self.scene("2b"):
                await self.steps("with streaming", 3, lambda: self.post(session, stream=True))
            streamed, streamed_findings = self.take()
        await resolver.close()
        first = summarize(streamed)["first_chunk"]["p50"]
        total = summarize(streamed)["total"]["p50"]
        plain_total = summarize(plain)["total"]["p50"]
        return [
            Scene(
                "2a. Without streaming: nothing arrives until the whole answer is ready",
                plain,
                f"The answer arrived all at once after {dur(plain_total)}.",
                plain_findings,
            ),
            Scene(
                "2b. Streaming: the first token comes early, the span lasts to the end",
                streamed,
                f"First token after {dur(first)}; the stream ended after {dur(total)}. The "
                "request span covers the whole stream, not only the headers.",
                streamed_findings,
            ),
        ]

    async def burst(self) -> list[Scene]:
        with self.scene("3"):
            async with watching(self.metrics, HOST) as pool:
                session, resolver = self.session(limit_per_host=2)
                async with session:
                    await self.steps(
                        "8 at once, limit_per_host=2",
                        8,
                        lambda: self.post(session),
                        concurrent=True,
                    )
                    await asyncio.sleep(0.1)  # the pool drained, its connections kept alive
                    kept = pool.states[-1].idle if pool.states else 0
                await resolver.close()
                await asyncio.sleep(0.1)  # the connections close
        results, findings = self.take()
        queued = [r.phases["queue"] for r in results if "queue" in r.phases]
        longest = max(queued, default=0.0)
        peak = max(pool.states, key=lambda s: (s.active, s.waiting), default=None)
        filled = (
            f"The pool filled ({peak.active} of {peak.limit} connections active) while "
            f"{max(s.waiting for s in pool.states)} requests waited, then drained to {kept} "
            "idle connections kept alive, and to none when the session closed. "
            if peak is not None and peak.limit
            else ""
        )
        return [
            Scene(
                "3. A burst of 8 with limit_per_host=2: the pool makes them queue",
                results,
                f"{filled}{len(queued)} of {len(results)} requests waited in http.queue, up "
                f"to {dur(longest)}: that time is the client's pool, not the model.",
                findings,
                pool_table(pool.states),
            )
        ]

    async def rate_limited(self, state: Any) -> list[Scene]:
        session, resolver = self.session()

        @llm_latency.retry(attempts=4, base_delay=0.1)
        async def complete() -> None:
            await self.post(session, raise_for_status=True)

        async with session:
            state.rate_limit_next = 1
            with self.scene("4"):
                await self.steps("a rate-limited call, retried", 1, complete)
        await resolver.close()
        results, findings = self.take()
        waited = sum(r.total for r in results if r.kind == "backoff")
        return [
            Scene(
                "4. Rate-limited, then retried by llm_latency.retry",
                results,
                f"The first attempt got a 429 with retry-after-ms={PROFILE.retry_after_ms}; "
                f"the call waited {dur(waited)} (retry.backoff) and the second attempt "
                "succeeded. The wait is visible, not folded into the call's latency.",
                findings,
            )
        ]

    async def tokens(self) -> list[Scene]:
        usage = {"stream_options": {"include_usage": True}}
        session, resolver = self.session()
        async with session:
            with self.scene("5"):
                await self.post(session)  # warm the pool
                self.take()
                for label, tokens in (("a short answer", SHORT), ("a long answer", LONG)):
                    body = {**usage, "max_tokens": tokens}
                    await self.steps(label, 2, functools.partial(self.post, session, True, body))
            results, findings = self.take()
        await resolver.close()
        short = [r for r in results if r.output_tokens == SHORT]
        long = [r for r in results if r.output_tokens == LONG]
        if not short or not long:  # a request failed: no comparison to draw
            return [Scene("5. Tokens", results, "The answers' tokens were not reported.", findings)]
        per_token = summarize(results)["per_output_token"]["p50"]
        first = summarize(results)["first_token"]["p50"]
        extra = summarize(long)["total"]["p50"] - summarize(short)["total"]["p50"]
        return [
            Scene(
                f"5. Tokens: answers of {SHORT} and {LONG} tokens from the same model",
                results,
                f"Both got their first token after {dur(first)} and then {dur(per_token)} per "
                f"output token ({1 / per_token:.0f} tokens/s): the long answer took "
                f"{dur(extra)} longer because it had {LONG - SHORT} more tokens, not because "
                "the provider was slower. max_tokens (or a request for a shorter answer) "
                "shortens it; the spans carry gen_ai.usage.*, llm_latency.time_to_first_token "
                "and llm_latency.time_per_output_token.",
                findings,
            )
        ]


def _print_scene(console: Console, scene: Scene, first: bool = False) -> None:
    if not first:
        console.print()
    waterfall(console, scene.results, scene.title, rate_limits=False)
    status_tables(console, scene.results)
    if scene.extra is not None:
        print_trimmed(console, scene.extra)
    for line in wrap(f"→ {scene.closing}", console.width, "", "  "):
        console.print(Text(line, style="bold green"), soft_wrap=True)
    print_findings(console, scene.findings)


def _print_recap(console: Console, scenes: list[Scene]) -> None:
    """The closing lines: each rule that fired, and in which scenes."""
    where: dict[str, list[str]] = {}
    for scene in scenes:
        for finding in scene.findings:
            where.setdefault(finding.rule, []).append(scene.title.split(" ", 1)[0].rstrip("."))
    rules = [f"{rule} ({', '.join(names)})" for rule, names in where.items()]
    recap = "The diagnosis, scene by scene: " + ("; ".join(rules) if rules else "nothing") + "."
    console.print()
    for line in wrap(recap, console.width, "", "  "):
        console.print(Text(line, style="bold"), soft_wrap=True)


async def run(console: Console) -> None:
    """Run every scene and print it."""
    dns = LocalDNS({HOST: "127.0.0.1"}, delay=DNS_DELAY)
    try:
        async with running(PROFILE, tls=True, names=(HOST, "localhost", "127.0.0.1")) as server:
            assert server.ca_file is not None
            context = ssl.create_default_context(cafile=str(server.ca_file))
            url = server.url(host=HOST)
            intro = (
                f"llm-latency demo: a mock OpenAI-compatible server at {url} (TLS handshake "
                f"+{dur(PROFILE.tls_delay)}, DNS +{dur(DNS_DELAY)}, {dur(PROFILE.ttfb)} before "
                f"the first token, {PROFILE.tokens_per_second:g} tokens/s), called through "
                "aiohttp instrumented by llm-latency. After each scene: what "
                "llm_latency.diagnose finds in its spans."
            )
            for line in wrap(intro, console.width):
                console.print(Text(line), soft_wrap=True)
            with (
                instrumented("llm-latency-demo", ["aiohttp"]) as telemetry,
                Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    console=console,
                    transient=True,
                ) as progress,
            ):
                tracer = telemetry.tracer_provider.get_tracer("llm_latency.demo")
                demo = Demo(
                    console, url, dns, context, telemetry.spans, telemetry.metrics, progress, tracer
                )
                scenes = [
                    *await demo.fresh_vs_pooled(),
                    *await demo.streaming(),
                    *await demo.burst(),
                    *await demo.rate_limited(server.state),
                    *await demo.tokens(),
                ]
            for number, scene in enumerate(scenes):
                _print_scene(console, scene, first=number == 0)
            _print_recap(console, scenes)
    finally:
        dns.stop()
    endpoint = otlp_endpoint()
    if endpoint:
        last = (
            f"Spans and metrics were exported to {endpoint} (service "
            "llm-latency-demo): open Jaeger (http://localhost:16686) and Grafana "
            "(http://localhost:3000) if you run deploy/compose."
        )
    else:
        last = (
            "Set OTEL_EXPORTER_OTLP_ENDPOINT (e.g. http://localhost:4318, with "
            "deploy/compose running) to send these traces to Jaeger and Grafana."
        )
    console.print()
    for line in wrap(last, console.width):
        console.print(Text(line), soft_wrap=True)


def main(console: Console | None = None) -> None:
    """Entry point of ``llm-latency demo``."""
    asyncio.run(run(console or make_console()))
