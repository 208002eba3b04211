"""Assertions shared by the client tests: phase durations against injected delays, phases
tiling their request span, failure outcomes compared with and without the plugin."""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

import llm_latency
from tests.conftest import Telemetry

# A phase lasts at least its injected delay, and not much more on a loaded 2-core machine.
SLACK = 0.3
EARLY = 0.005  # timers may fire this much early


def assert_about(value: float, expected: float) -> None:
    assert expected - EARLY <= value <= expected + SLACK, (value, expected)


def assert_tiles(telemetry: Telemetry) -> None:
    """Phases are in order, do not overlap, and lie within their request span (this runs after
    every test too; calling it in a test checks at that point)."""
    telemetry.assert_tiles()


@dataclass
class Outcome:
    kind: type[BaseException] | None
    text: str


async def run(scenario: Callable[[], Awaitable[Any]]) -> Outcome:
    try:
        await scenario()
    except BaseException as exc:  # CancelledError included: that is the program's outcome
        # Object addresses in messages (urllib3 names its connection objects) differ per run.
        return Outcome(type(exc), re.sub(r"0x[0-9a-f]+", "0x?", str(exc)))
    return Outcome(None, "")


async def compare(telemetry: Telemetry, scenario: Callable[[], Awaitable[Any]]) -> Outcome:
    """Run ``scenario`` without and then with the plugin; both must end the same way."""
    llm_latency.uninstrument()
    bare = await run(scenario)
    assert telemetry.spans() == []
    telemetry.instrument()
    traced = await run(scenario)
    assert traced == bare
    telemetry.assert_all_ended_once()
    return traced


def assert_failed(
    telemetry: Telemetry, phase: str, error_type: str, request: ReadableSpan | None = None
) -> None:
    """The request (the only one, unless given) failed in ``phase`` with ``error_type``, as
    DESIGN.md says: the failed phase span ERROR with the exception, and no later phase."""
    request = request or telemetry.request()
    assert request.attributes is not None
    assert request.status.status_code is StatusCode.ERROR
    assert request.attributes["llm_latency.failed_phase"] == phase
    assert request.attributes["error.type"] == error_type
    failed = telemetry.phases(request)[phase]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None
    assert failed.attributes["error.type"] == error_type
    (event,) = failed.events
    assert event.name == "exception"
    assert event.attributes is not None
    assert str(event.attributes["exception.type"]).endswith(error_type)
    assert failed.end_time is not None
    later = [p for p in telemetry.phases(request).values() if (p.start_time or 0) > failed.end_time]
    assert later == []


@contextlib.contextmanager
def full_backlog() -> Iterator[int]:
    """A port whose listen backlog is full: a TCP connect to it hangs (SYNs are dropped)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    try:
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
