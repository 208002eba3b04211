"""The patching layer never changes what the program does: faithful wrappers, guarded plugin
code, degrading per client when a library changed, and stacking with the wrapt-based official
instrumentations in either order."""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import logging
import os
import ssl
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import httpx2
import pytest
import requests
import tomllib
import wrapt
from aiohttp.base_protocol import BaseProtocol
from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.instrumentation.requests import RequestsInstrumentor
from opentelemetry.instrumentation.urllib3 import URLLib3Instrumentor
from opentelemetry.trace import SpanKind
from packaging.requirements import Requirement

import llm_latency
from llm_latency import instrumentor as instrumentor_module
from llm_latency.adapters import _aiohttp_attempt, _hooks, _wrappers
from llm_latency.adapters import aiohttp as aiohttp_adapter
from llm_latency.adapters._patching import PatchSet
from llm_latency.adapters._resolver import resolver_hooks
from llm_latency.call_spans import CallSpans
from llm_latency.emitter import Emitter
from llm_latency.instrumentor import SDKS, LLMLatencyInstrumentor, Target
from llm_latency.sse import SSECounter
from llm_latency.timeline import Timeline
from tests.attributes import attributes
from tests.conftest import Telemetry
from tests.servers import LLMServer
from tests.test_api import patched, snapshot

CLIENTS = ["aiohttp", "httpx", "httpx2", "requests"]


async def fetch(client: str, url: str, **options: Any) -> bytes:
    """One streamed request through ``client``; the body the program got."""
    if client == "aiohttp":
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, json={"m": 1}, **options) as response,
        ):
            return await response.read()
    if client == "requests":
        return await asyncio.to_thread(lambda: requests.post(url, json={"m": 1}).content)
    module = httpx if client == "httpx" else httpx2
    async with module.AsyncClient() as http:
        response = await http.post(url, json={"m": 1})
        return bytes(response.content)


# -- faithful wrappers --------------------------------------------------------------------------


def test_wrappers_keep_signature_names_and_wrapped() -> None:
    originals = snapshot()
    telemetry = Telemetry()
    telemetry.instrument()
    try:
        for (owner, name), original in zip(patched(), originals, strict=True):
            wrapper = vars(owner)[name]
            where = f"{getattr(owner, '__name__', owner)}.{name}"
            assert wrapper is not original, where
            assert inspect.signature(wrapper) == inspect.signature(original), where
            assert wrapper.__name__ == original.__name__, where
            assert wrapper.__qualname__ == original.__qualname__, where
            assert wrapper.__wrapped__ is original, where
            assert inspect.iscoroutinefunction(wrapper) == inspect.iscoroutinefunction(original)
    finally:
        llm_latency.uninstrument()


def test_per_chunk_hooks_are_plain_functions() -> None:
    """The hooks called per body chunk are no wrapt proxies (about 0.8 µs a call each, what the
    chunk's own bookkeeping costs), and still observe: a chunk fed is timed."""
    from aiohttp.streams import StreamReader
    from urllib3.response import HTTPResponse

    original = vars(StreamReader)["feed_data"]
    telemetry = Telemetry()
    telemetry.instrument()
    try:
        for owner, name in [(StreamReader, "feed_data"), (HTTPResponse, "_fp_read")]:
            hook = vars(owner)[name]
            assert isinstance(hook, types.FunctionType), (owner, name, hook)
            assert not isinstance(hook, wrapt.ObjectProxy)

        async def feed_one() -> Timeline:
            loop = asyncio.get_running_loop()
            reader = StreamReader(BaseProtocol(loop), 2**16, loop=loop)
            timeline = Timeline("POST", "http://llm.test/v1/chat/completions")
            _aiohttp_attempt.streams[id(reader)] = timeline
            try:
                reader.feed_data(b"data: {}\n\n")
            finally:
                del _aiohttp_attempt.streams[id(reader)]
            return timeline

        timeline = asyncio.run(feed_one())
        assert timeline.chunks == 1 and timeline.first_chunk_ns == timeline.last_chunk_ns > 0
    finally:
        llm_latency.uninstrument()
    assert vars(StreamReader)["feed_data"] is original  # taken out at uninstrument


def test_a_tap_sees_what_a_wrapt_proxy_would_hand_it() -> None:
    """On a method, a Tap gets the instance and the named argument; on a module's function,
    None and the argument; taken out, the originals are back."""

    class Reader:
        def feed(self, data: bytes, size: int = 0) -> int:
            return len(data) + size

    def feed(data: bytes) -> int:
        return len(data)

    module = types.ModuleType("llm_latency_test_module")
    module.feed = feed  # type: ignore[attr-defined]
    seen: list[tuple[Any, Any]] = []
    patches = PatchSet("test", lambda where: None)
    tap = _hooks.Tap(lambda instance, value: seen.append((instance, value)), argument="data")
    assert patches.group("reads", [(Reader, "feed", tap), (module, "feed", tap)])
    reader = Reader()
    assert reader.feed(b"abc", 1) == 4
    assert reader.feed(data=b"ab") == 2
    assert module.feed(b"abcd") == 4
    assert seen == [(reader, b"abc"), (reader, b"ab"), (None, b"abcd")]
    assert inspect.signature(Reader.feed) == inspect.signature(vars(Reader)["feed"].__wrapped__)
    patches.restore()
    assert module.feed is feed
    assert "feed" in vars(Reader) and not hasattr(vars(Reader)["feed"], "__wrapped__")


async def test_options_read_from_the_signature_are_not_dropped(
    tls_server: LLMServer, client_ssl: ssl.SSLContext
) -> None:
    # google-genai builds its aiohttp options from inspect.signature(ClientSession._request):
    # an ssl context for a private CA must reach aiohttp.
    telemetry = Telemetry()
    telemetry.instrument()
    try:
        accepted = inspect.signature(aiohttp.ClientSession._request).parameters
        options = {k: v for k, v in {"ssl": client_ssl, "unknown": 1}.items() if k in accepted}
        assert set(options) == {"ssl"}
        body = await fetch("aiohttp", tls_server.url(host="localhost"), **options)
    finally:
        llm_latency.uninstrument()
    assert body
    assert len(telemetry.requests()) == 1


# -- the sync and async wrappers ---------------------------------------------------------------


class _Unasync(ast.NodeTransformer):
    """``async def`` -> ``def``, ``await x`` -> ``x``."""

    def visit_Await(self, node: ast.Await) -> ast.AST:
        inner: ast.AST = self.visit(node.value)
        return inner

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        self.generic_visit(node)
        return ast.FunctionDef(**{field: getattr(node, field) for field in node._fields})


def _without_docstring(function: ast.FunctionDef) -> ast.FunctionDef:
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        function.body = body[1:]
    return function


@pytest.mark.parametrize(
    ("sync_name", "async_name"),
    [("sync_wrapper", "async_wrapper"), ("sync_method", "async_method")],
)
def test_the_async_wrapper_is_the_sync_one_with_await(sync_name: str, async_name: str) -> None:
    tree = ast.parse(inspect.getsource(_wrappers))
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    sync, awaiting = functions[sync_name], functions[async_name]
    unasynced = _without_docstring(_Unasync().visit(awaiting))
    unasynced.name = sync.name
    assert ast.dump(unasynced) == ast.dump(_without_docstring(sync))


# -- guarded plugin code ------------------------------------------------------------------------

FAULTS: dict[str, tuple[Any, str]] = {
    "sse counter": (SSECounter, "feed"),
    "phase bookkeeping": (Timeline, "begin"),
    "chunk bookkeeping": (Timeline, "chunk"),
    "span start": (Emitter, "start"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("client", CLIENTS)
async def test_a_fault_in_plugin_code_never_reaches_the_program(
    telemetry: Telemetry,
    server: LLMServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    client: str,
    fault: str,
) -> None:
    url = server.url(chunks=4, gap=0.01, sse=1)
    llm_latency.uninstrument()
    expected = await fetch(client, url)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("plugin bug")

    owner, name = FAULTS[fault]
    monkeypatch.setattr(owner, name, broken)
    telemetry.instrument()
    with caplog.at_level(logging.ERROR, logger="llm_latency"):
        for _ in range(3):
            assert await fetch(client, url) == expected
    faults = [r for r in caplog.records if r.exc_text and "plugin bug" in r.exc_text]
    assert len(faults) == 1  # logged once
    telemetry.assert_all_ended_once()  # an attempt that started still ended


@pytest.mark.parametrize("fault", ["open_call", "start_backoff", "close_call"])
def test_a_fault_in_the_retry_helpers_tracing_never_reaches_the_program(
    telemetry: Telemetry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fault: str,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("plugin bug")

    monkeypatch.setattr(CallSpans, fault, broken)
    calls: list[int] = []

    @llm_latency.retry(attempts=3, base_delay=0.0)
    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("transient")
        return 42

    with caplog.at_level(logging.ERROR, logger="llm_latency"):
        assert flaky() == 42
    assert len(calls) == 3
    assert len([r for r in caplog.records if r.exc_text and "plugin bug" in r.exc_text]) == 1
    telemetry.assert_all_ended_once()


# -- degrading when a client library changed ------------------------------------------------------


async def test_a_missing_phase_hook_loses_that_phase_only(
    server: LLMServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(aiohttp_adapter, "_TCP_CONNECTOR", "aiohttp.connector:RenamedConnector")
    telemetry = Telemetry()
    with caplog.at_level(logging.WARNING, logger="llm_latency"):
        telemetry.instrument()
    try:
        await fetch("aiohttp", server.url())
        await fetch("httpx2", server.url())
    finally:
        llm_latency.uninstrument()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith("llm-latency: aiohttp ")
    assert (
        "the dns phase (aiohttp.connector.RenamedConnector._resolve_host not found)"
        in (warnings[0])
    )
    assert "the connect and tls phases" in warnings[0]
    aiohttp_span, httpx2_span = telemetry.requests()
    assert set(telemetry.phases(aiohttp_span)) == {"send", "wait", "receive"}
    assert "connect" in telemetry.phases(httpx2_span)


async def test_a_missing_essential_hook_turns_that_client_off(
    server: LLMServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    before = snapshot()
    original = vars(aiohttp.ClientSession)["_request"]
    monkeypatch.setattr(aiohttp_adapter, "_READER", "aiohttp.streams:RenamedReader")
    telemetry = Telemetry()
    with caplog.at_level(logging.WARNING, logger="llm_latency"):
        telemetry.instrument()  # never raises
    try:
        assert vars(aiohttp.ClientSession)["_request"] is original  # nothing left half-done
        await fetch("aiohttp", server.url())
        await fetch("requests", server.url())
    finally:
        llm_latency.uninstrument()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.startswith("llm-latency: aiohttp ")
    assert "is not instrumented" in warning
    assert "aiohttp.streams.RenamedReader" in warning
    (only,) = telemetry.requests()
    assert "urllib3" in str(attributes(only).get("url.full")) or only.name.startswith("POST")
    assert snapshot() == before


async def test_a_client_outside_its_supported_range_is_skipped(
    server: LLMServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clients = dict(instrumentor_module.CLIENTS)
    clients["aiohttp"] = Target("aiohttp", "aiohttp < 1", clients["aiohttp"].adapter)
    monkeypatch.setattr(instrumentor_module, "CLIENTS", clients)
    telemetry = Telemetry()
    with caplog.at_level(logging.WARNING, logger="llm_latency"):
        telemetry.instrument()
    try:
        await fetch("aiohttp", server.url())
        await fetch("httpx", server.url())
    finally:
        llm_latency.uninstrument()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.startswith("llm-latency: aiohttp is not instrumented: ")
    assert "aiohttp < 1" in warning
    assert len(telemetry.requests()) == 1


def test_instrumentation_dependencies_are_the_supported_ranges() -> None:
    dependencies = [Requirement(r) for r in LLMLatencyInstrumentor().instrumentation_dependencies()]
    names = [requirement.name for requirement in dependencies]
    assert names == [
        "aiohttp", "httpcore", "httpcore2", "urllib3", "openai", "anthropic",
        "groq", "google-genai", "mistralai", "cohere", "botocore", "litellm",
    ]  # fmt: skip
    # The same ranges as the package's extras (the versions CI tests, oldest and newest).
    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    declared = {
        requirement.name: requirement.specifier
        for group in extras.values()
        for requirement in map(Requirement, group)
        if not requirement.name.startswith("llm-latency")
    }
    for requirement in dependencies:
        assert requirement.specifier == declared[requirement.name], requirement.name
    # Every client is within its range here, so nothing conflicts.
    assert LLMLatencyInstrumentor()._check_dependency_conflicts() is None


def patches_of(adapter: object) -> PatchSet:
    """An adapter's patches (each adapter class keeps its own ``PatchSet``)."""
    patches = vars(adapter)["_patches"]
    assert isinstance(patches, PatchSet), adapter
    return patches


def test_docs_list_every_hook() -> None:
    # Each SDK's hooks go in when it is imported: every one is imported here (litellm from the
    # price list it ships, not one fetched), whatever other tests this worker ran.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    for target in SDKS.values():
        module = target.trigger()
        assert module is not None, f"{target.distribution} is not installed"
        importlib.import_module(module)

    documented = set()
    for line in (Path(__file__).parents[1] / "docs" / "patching.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 4 and cells[2].startswith("`"):
            documented.add((cells[0], cells[1], cells[2].strip("`")))
    telemetry = Telemetry()
    telemetry.instrument()
    try:
        adapters = LLMLatencyInstrumentor()._adapters
        hooked = {(a.name, cap, target) for a in adapters for cap, target in patches_of(a).targets}
        resolver = resolver_hooks._patches
        assert resolver is not None
        shared = "httpx, httpx2, requests"
        hooked |= {(shared, capability, target) for capability, target in resolver.targets}
    finally:
        llm_latency.uninstrument()
    assert documented == hooked


# -- stacking with the official, wrapt-based instrumentations -------------------------------------

OFFICIAL: dict[str, tuple[Callable[[], Any], str]] = {
    "urllib3": (URLLib3Instrumentor, "requests"),
    "requests": (RequestsInstrumentor, "requests"),
    "httpx": (HTTPXClientInstrumentor, "httpx"),
    "aiohttp-client": (AioHttpClientInstrumentor, "aiohttp"),
}


def scopes(telemetry: Telemetry) -> list[str]:
    return sorted(
        "ours" if s.instrumentation_scope.name == "llm_latency" else "theirs"
        for s in telemetry.spans()
        if s.instrumentation_scope is not None
        and (s.kind is SpanKind.CLIENT or "url.full" in (s.attributes or {}))
    )


@pytest.fixture
def no_instrumentation() -> Iterator[None]:
    yield
    llm_latency.uninstrument()
    for make, _ in OFFICIAL.values():
        make().uninstrument()


@pytest.mark.usefixtures("no_instrumentation")
@pytest.mark.parametrize("dropped_first", ["ours", "theirs"])
@pytest.mark.parametrize("installed_first", ["ours", "theirs"])
@pytest.mark.parametrize("official", sorted(OFFICIAL))
async def test_stacks_with_an_official_instrumentation(
    server: LLMServer, official: str, installed_first: str, dropped_first: str
) -> None:
    make, client = OFFICIAL[official]
    theirs = make()
    telemetry = Telemetry()
    before = snapshot()
    install: dict[str, Callable[[], None]] = {
        "ours": telemetry.instrument,
        "theirs": lambda: theirs.instrument(
            tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
        ),
    }
    remove: dict[str, Callable[[], None]] = {
        "ours": llm_latency.uninstrument,
        "theirs": theirs.uninstrument,
    }
    other = "theirs" if installed_first == "ours" else "ours"
    install[installed_first]()
    install[other]()

    async def one_request() -> list[str]:
        telemetry.exporter.clear()
        body = await fetch(client, server.url())
        assert body
        return scopes(telemetry)

    assert await one_request() == ["ours", "theirs"]
    remove[dropped_first]()
    kept = "theirs" if dropped_first == "ours" else "ours"
    assert await one_request() == [kept]
    remove[kept]()
    assert await one_request() == []
    assert snapshot() == before
