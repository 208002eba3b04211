"""The public API: instrument(), uninstrument(), the instrumentor, configure=True, the entry
point under ``opentelemetry-instrument``, suppression, and never breaking the program."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import anthropic  # noqa: F401  (an SDK: hooked once imported)
import botocore.client  # noqa: F401  (an SDK: hooked once imported)
import httpcore  # noqa: F401  (httpx imports it only when a client is made)
import httpcore2  # noqa: F401  (httpx2 imports it only when a client is made)
import openai  # noqa: F401  (an SDK: hooked once imported)
import pytest
from opentelemetry.instrumentation.utils import (
    suppress_http_instrumentation,
    suppress_instrumentation,
)

import llm_latency
from llm_latency.adapters._resolver import resolver_hooks
from llm_latency.emitter import Emitter
from llm_latency.instrumentor import LLMLatencyInstrumentor
from tests.conftest import Telemetry
from tests.servers import LLMServer

#: The adapters whose hooks ``patched()`` must find: every client, and the SDKs imported here.
HOOKED = {"aiohttp", "httpcore", "httpcore2", "requests", "openai", "anthropic", "botocore"}


@functools.cache
def patched() -> tuple[tuple[Any, str], ...]:
    """Every ``(owner, attribute)`` the patch sets hook, read from a throwaway instrumentation:
    the clients' hooks, the shared resolver's, and those of the SDKs imported here."""
    Telemetry().instrument()
    try:
        adapters = LLMLatencyInstrumentor()._adapters
        assert {adapter.name for adapter in adapters} >= HOOKED
        patch_sets = [vars(adapter)["_patches"] for adapter in adapters]
        patch_sets.append(resolver_hooks._patches)
        return tuple(pair for patches in patch_sets for pair in patches.installed())
    finally:
        llm_latency.uninstrument()


def snapshot() -> list[Any]:
    """What each hooked attribute is now (inherited ones are looked up in the base class)."""
    return [inspect.getattr_static(owner, name) for owner, name in patched()]


def test_every_supported_client_is_instrumented_by_default() -> None:
    from llm_latency.instrumentor import select_clients

    assert select_clients(None) == ["aiohttp", "httpx", "httpx2", "requests"]


async def get(server: LLMServer, session: aiohttp.ClientSession | None = None) -> None:
    if session is None:
        async with aiohttp.ClientSession() as own:
            await get(server, own)
        return
    async with session.get(server.url()) as response:
        await response.read()


async def test_uninstrument_restores_everything(server: LLMServer) -> None:
    before = snapshot()
    telemetry = Telemetry()
    telemetry.instrument()
    changed = [then is not now for now, then in zip(snapshot(), before, strict=True)]
    assert all(changed), [patched()[i] for i, c in enumerate(changed) if not c]
    llm_latency.uninstrument()
    assert snapshot() == before
    await get(server)
    assert telemetry.spans() == []
    llm_latency.uninstrument()  # harmless when not instrumented


async def test_instrument_twice_is_harmless(telemetry: Telemetry, server: LLMServer) -> None:
    telemetry.instrument()
    llm_latency.instrument(configure=False)
    await get(server)
    assert len(telemetry.requests()) == 1


async def test_session_created_before_instrument(server: LLMServer) -> None:
    telemetry = Telemetry()
    async with aiohttp.ClientSession() as session:
        await get(server, session)
        telemetry.instrument()
        try:
            await get(server, session)
        finally:
            llm_latency.uninstrument()
    assert len(telemetry.requests()) == 1


@pytest.mark.parametrize("suppress", [suppress_instrumentation, suppress_http_instrumentation])
async def test_suppression(telemetry: Telemetry, server: LLMServer, suppress: Any) -> None:
    with suppress():
        await get(server)
    assert telemetry.spans() == []
    assert "traceparent" not in server.requests[-1]["headers"]


async def test_traceparent_is_injected(telemetry: Telemetry, server: LLMServer) -> None:
    await get(server)
    request = telemetry.request()
    assert request.context is not None
    traceparent = server.requests[-1]["headers"]["traceparent"]
    assert traceparent.split("-")[1:3] == [
        f"{request.context.trace_id:032x}",
        f"{request.context.span_id:016x}",
    ]


async def test_phase_spans_off(server: LLMServer) -> None:
    telemetry = Telemetry()
    telemetry.instrument(phase_spans=False)
    try:
        await get(server)
    finally:
        llm_latency.uninstrument()
    assert len(telemetry.spans()) == 1
    # The phase metrics are the connection set-up's (DESIGN.md, "Metrics"), spans or not.
    assert {p.attributes["llm_latency.phase"] for p in
            telemetry.metric_points("llm_latency.phase.duration")} == {"connect"}  # fmt: skip


def test_unknown_client_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown client 'curl'"):
        llm_latency.instrument(clients=["curl"], configure=False)
    assert not LLMLatencyInstrumentor().is_instrumented_by_opentelemetry


async def test_plugin_fault_never_reaches_the_program(
    telemetry: Telemetry,
    server: LLMServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(self: Emitter, *args: Any) -> None:
        raise RuntimeError("plugin bug")

    monkeypatch.setattr(Emitter, "_emit", broken)
    with caplog.at_level(logging.ERROR, logger="llm_latency"):
        for _ in range(3):
            await get(server)
    assert len([r for r in caplog.records if "plugin bug" in (r.exc_text or "")]) == 1
    assert len(telemetry.requests()) == 3  # the request spans still end
    telemetry.assert_all_ended_once()


#: One aiohttp GET after a set-up given by --setup.
CLIENT_PROGRAM = Path(__file__).parent / "programs" / "aiohttp_get.py"


def run_program(url: str, setup: str, *prefix: str, **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environment.update(env)
    result = subprocess.run(
        [*prefix, sys.executable, str(CLIENT_PROGRAM), "--setup", setup, url],
        capture_output=True, text=True, env=environment, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


async def _in_thread(func: Any, *args: Any, **kwargs: Any) -> Any:
    import asyncio

    return await asyncio.to_thread(func, *args, **kwargs)


async def test_configure_sets_up_providers_from_env(server: LLMServer) -> None:
    out = await _in_thread(
        run_program, server.url(), "instrument",
        OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="none",
        OTEL_SERVICE_NAME="configured-by-env",
    )  # fmt: skip
    assert '"name": "http.wait"' in out
    assert '"name": "GET /v1/chat/completions"' in out
    assert "configured-by-env" in out


async def test_configure_keeps_a_provider_already_set(server: LLMServer) -> None:
    out = await _in_thread(
        run_program, server.url(), "own",
        OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="none",
    )  # fmt: skip
    assert "MINE http.wait" in out
    assert '"name"' not in out  # no second, env-configured exporter


async def test_entry_point_under_opentelemetry_instrument(server: LLMServer) -> None:
    out = await _in_thread(
        run_program, server.url(), "none",
        str(Path(sys.executable).with_name("opentelemetry-instrument")),
        OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="none",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="aiohttp-client",
    )  # fmt: skip
    assert '"name": "http.wait"' in out
    assert '"llm_latency.phase": "receive"' in out
