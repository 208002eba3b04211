"""The options of ``instrument()``, bound once: one table (``llm_latency.settings``) gives each
its environment variable, its allowed values and its default, for ``llm_latency.instrument()``,
for ``LLMLatencyInstrumentor().instrument(...)`` and for ``opentelemetry-instrument``, which
passes no keyword at all; docs/configuration.md's table is held equal to it."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import llm_latency
from llm_latency import settings as settings_module
from llm_latency.instrumentor import CLIENTS, InstrumentKwargs, LLMLatencyInstrumentor, Target
from llm_latency.settings import OPTIONS, Settings
from tests.conftest import Telemetry
from tests.servers import LLMServer
from tests.test_api import run_program
from tests.test_docs_tables import table

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
PROVIDERS = ["tracer_provider", "meter_provider"]

#: Per option: a text of its environment variable other than the default, and its value.
SET: dict[str, tuple[str, object]] = {
    "clients": ("requests", ("requests",)),
    "capture_response_headers": ("x-one, x-two", ("x-one", "x-two")),
    "phase_spans": ("false", False),
    "phase_span_fast_path": ("FALSE", False),
    "phase_metrics": ("all", "all"),
    "configure": ("0", False),
    "time_per_output_chunk": ("true", True),
    "propagate": ("off", False),
}
#: Per option: a text of its variable that is not allowed (any header names are).
BAD_TEXT = {
    "clients": "requests,curl",
    "phase_spans": "maybe",
    "phase_span_fast_path": "2",
    "phase_metrics": "some",
    "configure": "yes please",
    "time_per_output_chunk": "enabled",
    "propagate": "none",
}
#: Per option: an argument that is not allowed.
BAD_ARGUMENT: dict[str, object] = {
    "clients": ["curl"],
    "capture_response_headers": [b"x-one"],
    "phase_spans": "false",
    "phase_span_fast_path": 0,
    "phase_metrics": "some",
    "configure": "no",
    "time_per_output_chunk": 1,
    "propagate": "false",
}
#: The options ``LLMLatencyInstrumentor().instrument()`` takes: all but ``configure``, which
#: only ``llm_latency.instrument()`` acts on (under opentelemetry-instrument the distro sets
#: the SDK up).
INSTRUMENTOR_OPTIONS = [name for name in SET if name != "configure"]


def option(name: str) -> settings_module.Option:
    (found,) = [row for row in OPTIONS if row.name == name]
    return found


def variable(name: str) -> str:
    """The variable each option is read from: llm-latency's own, but the standard one of the
    HTTP instrumentations for the response headers."""
    if name == "capture_response_headers":
        return "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_RESPONSE"
    return "OTEL_PYTHON_LLM_LATENCY_" + name.upper()


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for row in OPTIONS:
        monkeypatch.delenv(row.variable, raising=False)
    yield
    llm_latency.uninstrument()


def bound(how: str, **arguments: Any) -> Settings:
    """The Settings an instrumentation bound: started by ``llm_latency.instrument()``, or as
    ``opentelemetry-instrument`` starts it (the instrumentor, with no providers)."""
    if how == "instrument":
        telemetry = Telemetry()
        llm_latency.instrument(
            tracer_provider=telemetry.tracer_provider,
            meter_provider=telemetry.meter_provider,
            **arguments,
        )
    else:
        LLMLatencyInstrumentor().instrument(**arguments)
    assert LLMLatencyInstrumentor().is_instrumented_by_opentelemetry
    settings = LLMLatencyInstrumentor().settings
    assert settings is not None
    return settings


def paths(names: list[str]) -> list[tuple[str, str]]:
    """Each option with each way in that reads it."""
    return [
        (name, how)
        for name in names
        for how in ("instrument", "instrumentor")
        if how == "instrument" or name in INSTRUMENTOR_OPTIONS
    ]


def test_the_tables_here_cover_every_option() -> None:
    assert [row.name for row in OPTIONS] == list(SET)
    assert set(BAD_ARGUMENT) == set(SET)
    assert set(BAD_TEXT) == set(SET) - {"capture_response_headers"}


def test_instrument_takes_the_providers_and_the_settings() -> None:
    parameters = inspect.signature(llm_latency.instrument).parameters.values()
    assert [p.name for p in parameters] == PROVIDERS + [
        f.name for f in dataclasses.fields(Settings)
    ]
    assert all(p.kind is p.KEYWORD_ONLY and p.default is None for p in parameters)


def test_the_instrumentor_takes_the_same_keywords() -> None:
    assert list(InstrumentKwargs.__annotations__) == PROVIDERS + INSTRUMENTOR_OPTIONS
    doc = LLMLatencyInstrumentor.__doc__ or ""
    for name in INSTRUMENTOR_OPTIONS:
        assert f"``{name}``" in doc and f"``{variable(name)}``" in doc, name
    assert "``configure`` (" not in doc


@pytest.mark.parametrize("name", list(SET))
def test_each_option_has_its_variable(name: str) -> None:
    assert option(name).variable == variable(name)


@pytest.mark.parametrize(("name", "how"), paths(list(SET)))
def test_each_variable_sets_its_option(
    name: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    text, value = SET[name]
    monkeypatch.setenv(variable(name), text)
    settings = bound(how)
    assert getattr(settings, name) == value
    others = {row.name: row.default for row in OPTIONS if row.name != name}
    assert settings == Settings(**{name: value}, **others)  # type: ignore[arg-type]


def test_the_clients_variable_chooses_the_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_PYTHON_LLM_LATENCY_CLIENTS", "requests, httpx2")
    LLMLatencyInstrumentor().instrument()
    names = {adapter.name for adapter in LLMLatencyInstrumentor()._adapters}
    assert names & {"aiohttp", "httpcore", "httpcore2", "requests"} == {"requests", "httpcore2"}


@pytest.mark.parametrize(
    ("name", "how"), paths([n for n in SET if n != "capture_response_headers"])
)
def test_an_argument_beats_the_variable(
    name: str, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    text, value = SET[name]
    monkeypatch.setenv(variable(name), text)
    default = option(name).default
    given = tuple(CLIENTS) if default is None else default
    assert getattr(bound(how, **{name: given}), name) == given != value


@pytest.mark.parametrize("how", ["instrument", "instrumentor"])
def test_the_headers_argument_adds_to_the_standard_variable(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The response headers' variable is every HTTP client instrumentation's: a program's own
    extras do not silence what its deployment asks of them all."""
    monkeypatch.setenv(variable("capture_response_headers"), "x-one, x-two")
    settings = bound(how, capture_response_headers=["x-mine", "x-one"])
    assert settings.capture_response_headers == ("x-mine", "x-one", "x-two")
    assert [row.name for row in OPTIONS if row.adds] == ["capture_response_headers"]


@pytest.mark.parametrize(("name", "how"), paths(list(BAD_TEXT)))
def test_a_bad_variable_warns_once_and_keeps_the_default(
    name: str, how: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(variable(name), BAD_TEXT[name])
    with caplog.at_level(logging.WARNING, logger="llm_latency"):
        settings = bound(how)
    assert getattr(settings, name) == option(name).default
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    line = warning.getMessage()
    assert "\n" not in line
    assert variable(name) in line and repr(BAD_TEXT[name]) in line
    assert option(name).kind.allowed in line


@pytest.mark.parametrize(("name", "how"), paths(list(BAD_ARGUMENT)))
def test_a_bad_argument_raises(name: str, how: str) -> None:
    with pytest.raises(ValueError, match=f"^llm-latency: {name}=") as raised:
        bound(how, **{name: BAD_ARGUMENT[name]})
    assert option(name).kind.allowed in str(raised.value)
    assert not LLMLatencyInstrumentor().is_instrumented_by_opentelemetry


async def test_the_configure_variable_keeps_the_sdk_unset(server: LLMServer) -> None:
    """``OTEL_PYTHON_LLM_LATENCY_CONFIGURE=false`` is ``configure=False``: nothing sets the
    SDK up, so the console exporter the OTEL_* variables name prints nothing."""
    out = await asyncio.to_thread(
        run_program,
        server.url(), "instrument",
        OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="none",
        OTEL_PYTHON_LLM_LATENCY_CONFIGURE="false",
    )  # fmt: skip
    assert '"name"' not in out


async def test_a_variable_reaches_a_program_under_opentelemetry_instrument(
    server: LLMServer,
) -> None:
    out = await asyncio.to_thread(
        run_program,
        server.url(), "none", str(Path(sys.executable).with_name("opentelemetry-instrument")),
        OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="none",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="aiohttp-client",
        OTEL_PYTHON_LLM_LATENCY_PHASE_SPANS="false",
    )  # fmt: skip
    assert '"name": "GET /v1/chat/completions"' in out
    assert '"name": "http.wait"' not in out


def test_a_client_not_installed_is_skipped_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    telemetry = Telemetry()
    missing = Target(
        "llm_latency_no_such_module", "httpcore2 >= 2.7, < 3", CLIENTS["httpx2"].adapter
    )
    monkeypatch.setitem(CLIENTS, "httpx2", missing)
    with caplog.at_level(logging.WARNING, logger="llm_latency"):
        telemetry.instrument(clients=["httpx2", "requests"])
    names = {adapter.name for adapter in LLMLatencyInstrumentor()._adapters}
    assert names & {"aiohttp", "httpcore", "httpcore2", "requests"} == {"requests"}
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "httpx2" in warning and "not installed" in warning


async def test_the_set_up_hook_is_no_keyword_of_the_instrumentor(server: LLMServer) -> None:
    """What runs before the first request is ``llm_latency.instrument()``'s own business, not
    a keyword a caller of the instrumentor can pass."""
    called: list[bool] = []
    telemetry = Telemetry()
    LLMLatencyInstrumentor().instrument(
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
        before_first_request=lambda: called.append(True),
    )
    async with aiohttp.ClientSession() as session, session.get(server.url()) as response:
        await response.read()
    assert len(telemetry.requests()) == 1
    assert called == []


def test_the_configuration_table_is_the_settings() -> None:
    assert table("\n## Options\n", PAGE) == [
        [f"`{row.name}`", f"`{row.variable}`", row.kind.allowed, row.kind.show(row.default)]
        for row in OPTIONS
    ]


def test_every_client_name_has_a_target() -> None:
    assert tuple(CLIENTS) == settings_module.CLIENT_NAMES


@pytest.mark.parametrize("command", ["probe", "monitor"])
def test_the_command_line_keeps_the_phase_spans_it_reads(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line's reports are made of the phase spans: a variable set for the
    program's own instrumentation does not take them away."""
    from llm_latency.cli.monitor_export import probe_telemetry
    from llm_latency.cli.telemetry import instrumented

    monkeypatch.setenv("OTEL_PYTHON_LLM_LATENCY_PHASE_SPANS", "false")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    with instrumented("test", ["aiohttp"]) if command == "probe" else probe_telemetry("test"):
        settings = LLMLatencyInstrumentor().settings
        assert settings is not None and settings.phase_spans
