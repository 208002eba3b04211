"""``Settings``: the options of ``instrument()``, bound once, from one table.

The table is :class:`Settings` itself: each field is one option, and its metadata give the
option's kind (the values it takes, from an argument or from its environment variable's text),
its environment variable and its help. From the table come the fields, the checks, the reading
of the environment (:func:`resolve`), the instrumentor's keywords and docstring, and the table
of docs/configuration.md (held equal by ``tests/test_settings.py``). The objects that read an
option (the emitter, the attempt metrics) take the bound value: no default, no check of their
own.

An option is taken from the argument given (``None`` is not given), else from its environment
variable (set and not blank), else its default: so ``opentelemetry-instrument``, which passes
no argument, reaches every option. A bad argument raises ``ValueError`` at start-up (it is the
program's mistake, and the program is there to see it); a bad environment value costs one
warning line and the default (the environment is a deployment's, often shared by programs, and
must not stop one).

The providers are not options: they are objects a program builds (no variable can hold one),
and what they mean is OpenTelemetry's (the API's globals when absent, ``OTEL_*`` variables for
their own set-up). They stay the instrumentor's keywords as contrib's instrumentors take them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, cast

from opentelemetry.util.http import OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_RESPONSE

from llm_latency.metrics import PHASE_METRICS
from llm_latency.semconv import (
    GEN_AI_LATEST_EXPERIMENTAL,
    GEN_AI_LATEST_EXPERIMENTAL_DUP,
    SEMCONV_STABILITY_OPT_IN,
    GenAINames,
)

_logger = logging.getLogger(__name__)

#: llm-latency's own variables: this prefix, then the option's name in capitals.
PREFIX: Final = "OTEL_PYTHON_LLM_LATENCY_"

#: The client libraries ``clients`` may name (``instrumentor.CLIENTS`` hooks each).
CLIENT_NAMES: Final = ("aiohttp", "httpx", "httpx2", "requests")

_TRUE: Final = frozenset({"true", "1", "yes", "on"})
_FALSE: Final = frozenset({"false", "0", "no", "off"})


class Kind(Protocol):
    """The values of one option: from an argument, or from its variable's text."""

    #: The allowed values, as the messages and the docs say them.
    allowed: str

    def argument(self, value: object) -> object:
        """The option's value for an argument; ValueError (a detail, or empty) if not allowed."""
        ...

    def text(self, text: str) -> object:
        """The option's value for a variable's (stripped, not empty) text; ValueError if not
        allowed."""
        ...

    def show(self, value: object) -> str:
        """A value as the docs show it."""
        ...


class Flag:
    """On or off: ``True``/``False`` as an argument (nothing else: ``"false"`` is truthy)."""

    allowed = "`true` or `false`"

    def argument(self, value: object) -> object:
        if isinstance(value, bool):
            return value
        raise ValueError("")

    def text(self, text: str) -> object:
        lowered = text.lower()
        if lowered in _TRUE or lowered in _FALSE:
            return lowered in _TRUE
        raise ValueError("")

    def show(self, value: object) -> str:
        return "`true`" if value else "`false`"


class Choice:
    """One name among ``choices``."""

    def __init__(self, choices: Collection[str]) -> None:
        self.choices = tuple(choices)
        self.allowed = " or ".join(f"`{choice}`" for choice in self.choices)

    def argument(self, value: object) -> object:
        if isinstance(value, str) and value in self.choices:
            return value
        raise ValueError("")

    def text(self, text: str) -> object:
        return self.argument(text.lower())

    def show(self, value: object) -> str:
        return f"`{value}`"


class Names:
    """A list of ``noun`` names, comma-separated in a variable (or a string argument): among
    ``choices`` when given (in lower case then), any otherwise. ``none``: what an unset list
    (``None``) means; ``empty``: what an empty one means."""

    def __init__(self, choices: Collection[str] | None, noun: str, *, none: str, empty: str):
        self.choices = None if choices is None else tuple(choices)
        self.noun = noun
        listed = (
            "" if self.choices is None else " among " + ", ".join(f"`{c}`" for c in self.choices)
        )
        self.allowed = f"{noun} names{listed}, comma-separated"
        self._none = none
        self._empty = empty

    def argument(self, value: object) -> object:
        if isinstance(value, str):
            return self._checked(value.split(","))
        if not isinstance(value, Iterable):
            raise ValueError("")
        names = list(value)
        if not all(isinstance(name, str) for name in names):
            raise ValueError("")
        return self._checked(names)

    def text(self, text: str) -> object:
        return self._checked((text.lower() if self.choices else text).split(","))

    def _checked(self, names: list[str]) -> tuple[str, ...]:
        kept = [stripped for name in names if (stripped := name.strip())]
        if self.choices is not None:
            unknown = [name for name in kept if name not in self.choices]
            if unknown:
                raise ValueError(f"unknown {self.noun} {', '.join(map(repr, unknown))}")
        return tuple(dict.fromkeys(kept))

    def show(self, value: object) -> str:
        if value is None:
            return self._none
        names = cast(tuple[str, ...], value)
        return ", ".join(f"`{name}`" for name in names) if names else self._empty


def _option(
    default: Any,
    kind: Kind,
    help: str,
    *,
    variable: str = "",
    instrumentor: bool = True,
    adds: bool = False,
) -> Any:
    """A field of :class:`Settings`: its default, and the rest of its row as metadata
    (:class:`Option` says what each is; ``variable``: llm-latency's own when not given)."""
    row = {"kind": kind, "help": help, "variable": variable, "instrumentor": instrumentor}
    return dataclasses.field(default=default, metadata={**row, "adds": adds})


@dataclass(frozen=True)
class Settings:
    """Every option of ``instrument()`` that shapes what llm-latency does, bound once. The
    order of the fields is ``instrument()``'s."""

    clients: tuple[str, ...] | None = _option(
        None,
        Names(CLIENT_NAMES, "client", none="every one installed", empty="none"),
        "the client libraries to hook.",
    )
    capture_response_headers: tuple[str, ...] = _option(
        (),
        Names(None, "header", none="none", empty="none beyond the defaults"),
        "more response headers to record as ``http.response.header.*`` (credential and "
        "cookie headers are refused).",
        variable=OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_RESPONSE,
        adds=True,
    )
    phase_spans: bool = _option(True, Flag(), "one child span per phase.")
    phase_span_fast_path: bool = _option(
        True,
        Flag(),
        "hand the spans llm-latency writes to the SDK's processors as finished spans.",
    )
    phase_metrics: str = _option(
        "setup",
        Choice(PHASE_METRICS),
        "the phases ``llm_latency.phase.duration`` records: the connection's set-up, or all.",
    )
    configure: bool = _option(
        True,
        Flag(),
        "``llm_latency.instrument()`` sets the SDK up from ``OTEL_*`` at the first request if "
        "nothing else has.",
        instrumentor=False,
    )
    time_per_output_chunk: bool = _option(
        False, Flag(), "record the interval between a stream's chunks as a histogram."
    )
    propagate: bool = _option(True, Flag(), "inject the trace context into each request.")


@dataclass(frozen=True)
class Option:
    """One row of the table: an option's name, default, kind, variable and help.
    ``instrumentor``: ``LLMLatencyInstrumentor().instrument()`` takes it (not ``configure``,
    the set-up under ``opentelemetry-instrument`` being the distro's). ``adds``: an argument
    adds to the variable's list instead of replacing it (the response headers: their variable
    is every HTTP client instrumentation's, which a program's own extras should not silence)."""

    name: str
    default: object
    kind: Kind
    variable: str
    help: str
    instrumentor: bool
    adds: bool


#: The table, in ``instrument()``'s order.
OPTIONS: Final = tuple(
    Option(
        field.name,
        field.default,
        field.metadata["kind"],
        field.metadata["variable"] or PREFIX + field.name.upper(),
        field.metadata["help"],
        field.metadata["instrumentor"],
        field.metadata["adds"],
    )
    for field in dataclasses.fields(Settings)
)


def resolve(given: Mapping[str, object], environ: Mapping[str, str] = os.environ) -> Settings:
    """The Settings of the arguments in ``given`` (by option name; None or absent: not given;
    other keys are ignored), else of the environment, else the defaults. Raises ValueError
    for a bad argument; logs one warning line per bad variable, whose option keeps its
    default."""
    values: dict[str, Any] = {}
    for option in OPTIONS:
        argument = given.get(option.name)
        if argument is not None:
            values[option.name] = _argument(option, argument)
            if not option.adds:
                continue
        text = environ.get(option.variable, "").strip()
        if not text:
            continue
        try:
            value = option.kind.text(text)
        except ValueError as exc:
            _logger.warning(
                "llm-latency: %s=%r is ignored (%sexpected %s); %s is %s",
                option.variable,
                text,
                f"{exc}; " if str(exc) else "",
                option.kind.allowed,
                option.name,
                option.kind.show(option.default),
            )
            continue
        if option.name in values:  # ``adds``: the argument's names, then the variable's
            value = tuple(dict.fromkeys((*values[option.name], *cast(tuple[str, ...], value))))
        values[option.name] = value
    return Settings(**values)


def _argument(option: Option, value: object) -> object:
    try:
        return option.kind.argument(value)
    except ValueError as exc:
        detail = f"{exc}; " if str(exc) else ""
        raise ValueError(
            f"llm-latency: {option.name}={value!r}: {detail}expected {option.kind.allowed}"
        ) from None


def keywords() -> str:
    """The instrumentor's keywords as docstring lines, each with its variable, help and
    default."""
    return "\n    ".join(
        f"- ``{option.name}`` (``{option.variable}``): {option.help} Default: "
        f"{option.kind.show(option.default)}."
        for option in OPTIONS
        if option.instrumentor
    )


def genai_names(environ: Mapping[str, str] = os.environ) -> GenAINames:
    """The GenAI names ``OTEL_SEMCONV_STABILITY_OPT_IN`` asks for, read as the official
    instrumentations read it (``opentelemetry-instrumentation``'s ``_semconv``): a
    comma-separated list whose other values (``http``, ``database/dup``, ...) are other
    instrumentations'; ``gen_ai_latest_experimental/dup`` wins over
    ``gen_ai_latest_experimental``. Read once, at ``instrument()``: the emitter then runs the
    recorders of that choice only."""
    listed = {value.strip() for value in environ.get(SEMCONV_STABILITY_OPT_IN, "").split(",")}
    if GEN_AI_LATEST_EXPERIMENTAL_DUP in listed:
        return GenAINames.DUP
    if GEN_AI_LATEST_EXPERIMENTAL in listed:
        return GenAINames.LATEST
    return GenAINames.OLD
