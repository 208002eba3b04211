"""One urllib3 attempt and the ways it ends (the requests adapter's response side).

One :class:`Attempt` per ``urlopen`` call (as httpcore's ``RequestStatus`` is one object per
request) holds the Timeline and the state of the response's reads; the response holds it in one
attribute. It ends once, through :meth:`Attempt.end`, in one of these ways (each has a test
in ``tests/test_urllib3_attempt_ends.py``, named by the first column):

| way               | what happens                                                 | ends        |
|-------------------|--------------------------------------------------------------|-------------|
| ``start_fault``   | the plugin fails after the request span started              | at once     |
| ``request_error`` | ``_make_request`` raises (urllib3 may retry after it)        | with error  |
| ``urlopen_error`` | ``urlopen`` raises                                           | with error  |
| ``not_handed``    | ``urlopen`` returns a response that does not hold the        | at once     |
|                   | attempt (a fault kept the two apart)                         |             |
| ``preloaded``     | the body was read when the response was built                | at once     |
|                   | (``preload_content``, an empty body, a closed response)      |             |
| ``body_read``     | urllib3 releases the connection (``release_conn``): the      | after the   |
|                   | body's end was read; inside a read, the read ends it         | read        |
| ``read_error``    | a read fails (``_error_catcher`` exits with an exception)    | with error  |
| ``closed``        | the response is closed: by the program, even mid-stream      | at once     |
|                   | while a chunked read is suspended in its generator           |             |
| ``framing_error`` | urllib3 closes the response on broken chunk framing, right   | with error, |
|                   | before raising: recognised by its caller on the stack        | after the   |
|                   | (``_update_chunk_length``), the end is left to the read      | read        |
| ``drained``       | ``drain_conn`` (a redirect, or the program discards it)      | at once     |
| ``collected``     | the response is garbage-collected unread, also inside a      | at once     |
|                   | reference cycle (the attempt's finalizer)                    |             |

The finalizer is needed for a cycle: IOBase's finalizer closes a collected response, but in a
reference cycle (Locust's response and its ``request_meta`` hold each other) the garbage
collector finalizes the cycle's objects in any order; when the ``http.client`` response inside
goes first, the urllib3 response already reads as closed and its ``close`` is never called.
The stack is looked at only when a response is closed, so reads pay nothing for it (a hook on
``_update_chunk_length`` would cost every chunk).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from contextvars import ContextVar
from types import CodeType, FrameType
from typing import Any, Final

from llm_latency.adapters._hooks import SKIP
from llm_latency.emitter import Emitter
from llm_latency.headers import select_from_multidict
from llm_latency.timeline import RECEIVE, Timeline

#: ``network.protocol.version`` of urllib3's ``version`` numbers.
_VERSIONS: Final = {10: "1.0", 11: "1.1", 20: "2"}
#: The one attribute llm-latency sets on a response: its attempt.
ATTEMPT: Final = "_llm_latency_attempt"


class Attempt:
    """One ``urlopen`` call's attempt, from its start to its one end (see the table above)."""

    __slots__ = ("emitter", "end_after_read", "reading", "timeline")

    def __init__(self, timeline: Timeline, emitter: Emitter) -> None:
        self.timeline = timeline
        self.emitter = emitter
        #: A read of the body is in progress (inside urllib3's ``_error_catcher``).
        self.reading = False
        #: The body ended during the read: the attempt ends when the read does.
        self.end_after_read = False

    def end(self, error: BaseException | None = None) -> None:
        """End the attempt, with ``error`` if it failed; only the first end counts."""
        if self.timeline.ended:
            return
        if error is None:
            self.emitter.finish(self.timeline)
        else:
            self.emitter.finish_failed(self.timeline, error)

    def body_ended(self) -> None:
        """The body is over (the connection is released, or urllib3 closes the response on
        a framing error): the attempt ends now, or with the read in progress, which knows
        whether it failed (urllib3 releases the connection before raising)."""
        if self.reading:
            self.end_after_read = True
        else:
            self.end()

    def read_ends(self, error: BaseException | None) -> None:
        """A read of the body ended, with ``error`` if it failed."""
        self.reading = False
        if error is not None and not isinstance(error, GeneratorExit):
            self.end(error)
        elif self.end_after_read:
            self.end()

    def __del__(self) -> None:  # collected: with its response, or with its urlopen call
        self.end()


# The attempt of the urlopen call running in this thread (urllib3 is synchronous).
current: ContextVar[Attempt | None] = ContextVar("llm_latency_urllib3", default=None)


def live_timeline() -> Timeline | None:
    """The Timeline of the attempt running in this thread, unless it has ended."""
    attempt = current.get()
    return None if attempt is None or attempt.timeline.ended else attempt.timeline


# -- hooks on urllib3's HTTPResponse ---------------------------------------------------------


def argument(args: tuple[Any, ...], kwargs: dict[str, Any], at: int, name: str) -> Any:
    """A call's argument by position (not counting ``self``) or name; None when not given."""
    return args[at] if len(args) > at else kwargs.get(name)


def response_begins(resp: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``HTTPResponse(body, headers, status, version, ...)`` is being built: the response
    holds its attempt from here on, and the facts of its headers are recorded before
    ``preload_content`` reads the whole body (and may end the attempt) inside it."""
    attempt = current.get()
    if attempt is None or attempt.timeline.ended or attempt.timeline.current_phase == RECEIVE:
        return SKIP
    resp.__dict__[ATTEMPT] = attempt  # first: from here on, the response's end ends it
    timeline = attempt.timeline
    timeline.advance(RECEIVE)
    # HTTPResponse(body, headers, status, version, ...), by position or by name
    given = len(args)
    status = args[2] if given > 2 else kwargs.get("status")
    if isinstance(status, int) and status:
        timeline.status_code = status
    version = args[3] if given > 3 else kwargs.get("version")
    if version in _VERSIONS:
        timeline.protocol_version = _VERSIONS[version]
    headers = args[1] if given > 1 else kwargs.get("headers")
    if headers is not None:
        timeline.response_headers = (
            select_from_multidict(headers, attempt.emitter.captured_headers)
            if hasattr(headers, "getlist")
            else list(headers.items())
        )
        timeline.response_body(headers.get("content-type"), headers.get("content-encoding"))
    return attempt, resp


def response_built(state: tuple[Attempt, Any], result: None) -> None:
    """The response is built: its attempt ends if there is no body left to read."""
    attempt, resp = state
    if resp._body is not None or resp.length_remaining == 0 or resp.closed:
        attempt.end()  # the body was read at once (preload_content), or there is none


def response_attempt(resp: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The attempt a response holds, unless it has ended (then the hook stays out)."""
    attempt: Attempt | None = resp.__dict__.get(ATTEMPT)
    return SKIP if attempt is None or attempt.timeline.ended else attempt


def body_ended(attempt: Attempt, result: Any) -> Any:
    """``release_conn`` returned: see :meth:`Attempt.body_ended`."""
    attempt.body_ended()
    return result


def ended(attempt: Attempt, result: Any) -> Any:
    """``drain_conn`` returned: the attempt ends."""
    attempt.end()
    return result


def closing(
    framing: CodeType | None, resp: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """The response is closed: by the program (even mid-stream, while a chunked read is
    suspended in its generator), or when it is garbage-collected, or by urllib3 itself on
    broken chunk framing, right before raising (that end is left to the read)."""
    attempt: Attempt | None = resp.__dict__.get(ATTEMPT)
    if attempt is not None and not attempt.timeline.ended:
        if called_from(framing):
            attempt.body_ended()
        else:
            attempt.end()
    return SKIP


class ErrorCatcher:
    """urllib3's ``_error_catcher`` context, telling the attempt how the read inside ended."""

    __slots__ = ("_attempt", "_inner")

    def __init__(self, attempt: Attempt, inner: Any) -> None:
        self._attempt = attempt
        self._inner = inner

    def __enter__(self) -> Any:
        self._attempt.reading = True
        return self._inner.__enter__()

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> Any:
        try:
            suppressed = self._inner.__exit__(kind, error, traceback)
        except BaseException as raised:  # urllib3 raised its own exception in place of error
            self._read_ends(raised)
            raise
        self._read_ends(None if suppressed else error)
        return suppressed

    def _read_ends(self, error: BaseException | None) -> None:
        try:
            self._attempt.read_ends(error)
        except Exception:
            self._attempt.emitter.failed_once("urllib3 response read")


def chunk_read(resp: Any, data: bytes) -> None:
    """A chunk of the body came from the socket (a ``Tap``: per chunk, kept cheap)."""
    if data:
        attempt: Attempt | None = resp.__dict__.get(ATTEMPT)
        if attempt is not None and not attempt.timeline.ended:
            attempt.timeline.chunk(data)


def code_of(owner: str, name: str) -> CodeType | None:
    """The code object of a function, to recognise it on the stack; None if it is missing."""
    module_name, _, class_name = owner.partition(":")
    try:
        function = inspect.getattr_static(
            getattr(importlib.import_module(module_name), class_name), name
        )
    except (ImportError, AttributeError):
        return None
    code = getattr(inspect.unwrap(function), "__code__", None)
    return code if isinstance(code, CodeType) else None


def called_from(code: CodeType | None, depth: int = 8) -> bool:
    """Whether ``code`` runs in one of the few frames below this call (checked only when a
    response is closed, so reads pay nothing for it)."""
    if code is None:
        return False
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and depth:
        if frame.f_code is code:
            return True
        frame, depth = frame.f_back, depth - 1
    return False
