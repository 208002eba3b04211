"""What an adapter writes a hook with: a :class:`Hook` (or, on a hot path, a :class:`Tap`) of
plain callbacks, which :class:`~llm_latency.adapters._patching.PatchSet` installs.

A :class:`Hook` is up to three callbacks, ``before`` (may decline the call with :data:`SKIP`),
``after`` and ``error``. They run inside ``try`` blocks, the program's own call never does: a
fault in a callback is logged once and the call goes on as if the plugin were not there
(``abandon`` lets the adapter end the attempt it was tracking). How a hook becomes a wrapper is
``_wrappers``' job.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

#: What ``before`` returns to let the call through untouched.
SKIP: Final = object()

Before = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]
After = Callable[[Any, Any], Any]
OnError = Callable[[Any, BaseException], None]
Abandon = Callable[[Any], None]
FaultReporter = Callable[[str], None]


class Rewrite:
    """What ``before`` returns to call the original with other arguments (and keep ``state``)."""

    __slots__ = ("args", "kwargs", "state")

    def __init__(self, state: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.state = state
        self.args = args
        self.kwargs = kwargs


class Hook:
    """Callbacks around one patched callable.

    - ``before(instance, args, kwargs)``: runs first; returns the state handed to the others,
      :data:`SKIP` to stay out of this call, or a :class:`Rewrite`;
    - ``after(state, result)``: runs when the call returned; returns the result to give the
      program (return ``result`` itself to change nothing);
    - ``error(state, exception)``: runs when the call raised (the exception then propagates);
    - ``abandon(state)``: runs when ``after`` or ``error`` faulted, to end what ``state`` tracks.
    """

    __slots__ = ("abandon", "after", "before", "error")

    def __init__(
        self,
        before: Before,
        after: After | None = None,
        error: OnError | None = None,
        abandon: Abandon | None = None,
    ) -> None:
        self.before = before
        self.after = after
        self.error = error
        self.abandon = abandon


class Tap:
    """A hook for a hot path (called per body chunk): ``observe(instance, value)`` runs after
    the call returned, guarded, with nothing before it. ``value`` is the call's result or, with
    ``argument`` (a parameter's name), what the call was given for it: its first argument after
    ``self``. On a plain function it calls ``observe`` itself, with no :class:`Hook`'s
    machinery in between."""

    __slots__ = ("argument", "observe")

    def __init__(self, observe: Callable[[Any, Any], None], argument: str | None = None) -> None:
        self.observe = observe
        self.argument = argument


def phase_hook(
    phase: int,
    attempt_of: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any],
    *,
    resume: bool = False,
) -> Hook:
    """A hook that times ``phase`` of the attempt ``attempt_of(instance, args, kwargs)`` finds
    around the call (None: not this call). ``resume`` keeps the phase's first start, for a
    phase the attempt may enter more than once."""

    def before(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        attempt = attempt_of(instance, args, kwargs)
        if attempt is None:
            return SKIP
        if resume:
            attempt.resume(phase)
        else:
            attempt.begin(phase)
        return attempt

    def after(attempt: Any, result: Any) -> Any:
        attempt.end_phase(phase)
        return result

    return Hook(before, after)
