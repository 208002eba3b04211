"""How a hook becomes a wrapper: guarded, faithful, and out of the program's tracebacks.

- **Faithful wrappers.** A hook is installed as a wrapper of the original (below, which kind):
  ``inspect.signature``, ``__name__``, ``__qualname__``, ``__wrapped__`` and coroutine-ness are
  the original's (libraries such as google-genai read the signature of what they call).
- **Guarded plugin code.** The hook's callbacks run inside ``try`` blocks, the program's own
  call never does: a fault in a callback is reported (logged once) and the call goes on as if
  the plugin were not there; ``abandon`` lets the adapter end the attempt it was tracking.
- **Plain functions where they can be.** A hook on a plain function (a method in a class, a
  function in a module) is a plain function itself, made with ``functools.update_wrapper``
  (the original's name, signature and ``__wrapped__``; ``async def`` for a coroutine
  function): a wrapt proxy costs about 0.8 µs a call here, more than a :class:`Tap`'s whole
  work on a body chunk. It stacks and is spliced out like a proxy. Other callables (a
  ``staticmethod``, a builtin) get a ``wrapt.FunctionWrapper``.
- **Sync and async twins.** ``async_wrapper`` is ``sync_wrapper`` with ``async``/``await``
  added, and a test keeps it so (``tests/test_patching.py`` compares their syntax trees with
  the ``await`` taken out). Two functions of about thirty lines do not earn a code generator
  and its build step, as httpcore's ``unasync`` of whole modules does: the test fails on any
  drift, and both stay plain code to read.
- **Out of the tracebacks.** A wrapper takes its own frames out of the traceback of an
  exception it lets through (:func:`_forget_own_frames`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import CodeType, TracebackType
from typing import Any, Final

from llm_latency.adapters._hooks import SKIP, FaultReporter, Hook, Rewrite, Tap


class Switch:
    """Shared by the wrappers of one patch set: off once the set is restored."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = True


def _settle(hook: Hook, state: Any, where: str, report: FaultReporter) -> None:
    report(where)
    if hook.abandon is not None:
        try:
            hook.abandon(state)
        except Exception:
            report(where)


def sync_wrapper(hook: Hook, where: str, report: FaultReporter, switch: Switch) -> Any:
    before, after, on_error = hook.before, hook.after, hook.error

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not switch.on:
            return wrapped(*args, **kwargs)
        try:
            state = before(instance, args, kwargs)
        except Exception:
            report(where)
            return wrapped(*args, **kwargs)
        if state is SKIP:
            return wrapped(*args, **kwargs)
        if type(state) is Rewrite:
            state, args, kwargs = state.state, state.args, state.kwargs
        if after is None and on_error is None:
            return wrapped(*args, **kwargs)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as exc:
            if on_error is not None:
                try:
                    on_error(state, exc)
                except Exception:
                    _settle(hook, state, where, report)
            # The exception's traceback keeps this frame: with nothing in it, a failed
            # request leaves nothing of the plugin's for the cyclic collector.
            _forget_own_frames(exc)
            del state, wrapped, instance, args, kwargs
            raise
        if after is None:
            return result
        try:
            return after(state, result)
        except Exception:
            _settle(hook, state, where, report)
            return result

    return wrapper


def tap_wrapper(tap: Tap, where: str, report: FaultReporter, switch: Switch) -> Any:
    observe, argument = tap.observe, tap.argument

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        if switch.on:
            try:
                if argument is None:
                    observe(instance, result)
                else:
                    observe(instance, args[0] if args else kwargs[argument])
            except Exception:
                report(where)
        return result

    return wrapper


def tapped_method(
    function: Any, tap: Tap, where: str, report: FaultReporter, switch: Switch
) -> Any:
    """The plain function ``function``, set on a class, observed by ``tap``: a plain function
    with the original's name, signature and ``__wrapped__`` that hands its first argument over
    as the instance, as wrapt's proxy would. A closure of its own per kind of tap (it runs per
    body chunk), with no choice left to make per call. A module's function gets the generic
    :func:`tap_wrapper` through :func:`plain_function`."""
    observe, argument = tap.observe, tap.argument

    if argument is None:

        def tapped_result(*args: Any, **kwargs: Any) -> Any:
            result = function(*args, **kwargs)
            if switch.on:
                try:
                    observe(args[0], result)
                except Exception:
                    report(where)
            return result

        return functools.update_wrapper(tapped_result, function)

    parameter: str = argument

    def tapped_argument(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        if switch.on:
            try:
                observe(args[0], args[1] if len(args) > 1 else kwargs[parameter])
            except Exception:
                report(where)
        return result

    return functools.update_wrapper(tapped_argument, function)


def plain_function(function: Any, wrap: Any) -> Any:
    """The module function ``function`` hooked by ``wrap`` (a wrapt-style ``wrap(wrapped,
    instance, args, kwargs)``) as a plain function with the original's name, signature,
    ``__wrapped__`` and coroutine-ness. (A function set on a class gets a twin of its own:
    :func:`sync_method`, :func:`async_method`, :func:`tapped_method`.)"""
    if inspect.iscoroutinefunction(function):

        async def hooked_function(*args: Any, **kwargs: Any) -> Any:
            try:
                return await wrap(function, None, args, kwargs)
            except BaseException as exc:
                _forget_own_frames(exc)
                del args, kwargs
                raise

        return functools.update_wrapper(hooked_function, function)

    def hooked_plain(*args: Any, **kwargs: Any) -> Any:
        try:
            return wrap(function, None, args, kwargs)
        except BaseException as exc:
            _forget_own_frames(exc)
            del args, kwargs
            raise

    return functools.update_wrapper(hooked_plain, function)


def async_wrapper(hook: Hook, where: str, report: FaultReporter, switch: Switch) -> Any:
    before, after, on_error = hook.before, hook.after, hook.error

    async def wrapper(
        wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if not switch.on:
            return await wrapped(*args, **kwargs)
        try:
            state = before(instance, args, kwargs)
        except Exception:
            report(where)
            return await wrapped(*args, **kwargs)
        if state is SKIP:
            return await wrapped(*args, **kwargs)
        if type(state) is Rewrite:
            state, args, kwargs = state.state, state.args, state.kwargs
        if after is None and on_error is None:
            return await wrapped(*args, **kwargs)
        try:
            result = await wrapped(*args, **kwargs)
        except BaseException as exc:
            if on_error is not None:
                try:
                    on_error(state, exc)
                except Exception:
                    _settle(hook, state, where, report)
            # The exception's traceback keeps this frame: with nothing in it, a failed
            # request leaves nothing of the plugin's for the cyclic collector.
            _forget_own_frames(exc)
            del state, wrapped, instance, args, kwargs
            raise
        if after is None:
            return result
        try:
            return after(state, result)
        except Exception:
            _settle(hook, state, where, report)
            return result

    return wrapper


def sync_method(
    function: Any, hook: Hook, where: str, report: FaultReporter, switch: Switch
) -> Any:
    """The plain function ``function``, set on a class, hooked by ``hook``: what
    :func:`plain_function` makes of :func:`sync_wrapper`, in one frame. The instance is the
    first argument, and the original is called with it, not bound to it first (hooks run on
    every request: a frame and a bound method less per call)."""
    before, after, on_error = hook.before, hook.after, hook.error

    def hooked(*args: Any, **kwargs: Any) -> Any:
        if not args or not switch.on:  # no instance: the original says what is wrong
            return function(*args, **kwargs)
        instance = args[0]
        try:
            state = before(instance, args[1:], kwargs)
        except Exception:
            report(where)
            return function(*args, **kwargs)
        if state is SKIP:
            return function(*args, **kwargs)
        if type(state) is Rewrite:
            state, args, kwargs = state.state, (instance, *state.args), state.kwargs
        if after is None and on_error is None:
            return function(*args, **kwargs)
        try:
            result = function(*args, **kwargs)
        except BaseException as exc:
            if on_error is not None:
                try:
                    on_error(state, exc)
                except Exception:
                    _settle(hook, state, where, report)
            _forget_own_frames(exc)
            del state, instance, args, kwargs  # what a failed request's traceback would keep
            raise
        if after is None:
            return result
        try:
            return after(state, result)
        except Exception:
            _settle(hook, state, where, report)
            return result

    return functools.update_wrapper(hooked, function)


def async_method(
    function: Any, hook: Hook, where: str, report: FaultReporter, switch: Switch
) -> Any:
    """:func:`sync_method` for a coroutine function (its twin: see the module's docstring)."""
    before, after, on_error = hook.before, hook.after, hook.error

    async def hooked(*args: Any, **kwargs: Any) -> Any:
        if not args or not switch.on:  # no instance: the original says what is wrong
            return await function(*args, **kwargs)
        instance = args[0]
        try:
            state = before(instance, args[1:], kwargs)
        except Exception:
            report(where)
            return await function(*args, **kwargs)
        if state is SKIP:
            return await function(*args, **kwargs)
        if type(state) is Rewrite:
            state, args, kwargs = state.state, (instance, *state.args), state.kwargs
        if after is None and on_error is None:
            return await function(*args, **kwargs)
        try:
            result = await function(*args, **kwargs)
        except BaseException as exc:
            if on_error is not None:
                try:
                    on_error(state, exc)
                except Exception:
                    _settle(hook, state, where, report)
            _forget_own_frames(exc)
            del state, instance, args, kwargs  # what a failed request's traceback would keep
            raise
        if after is None:
            return result
        try:
            return after(state, result)
        except Exception:
            _settle(hook, state, where, report)
            return result

    return functools.update_wrapper(hooked, function)


def _inner_code(*factories: Callable[..., Any]) -> frozenset[CodeType]:
    """The code of the functions that ``factories`` define: the wrappers this module installs
    (one code object for all the closures a factory makes)."""
    return frozenset(
        const
        for factory in factories
        for const in factory.__code__.co_consts
        if isinstance(const, CodeType)
    )


#: The code of every frame a hook puts between the program and its client library.
_OWN_CODE: Final = _inner_code(
    sync_wrapper,
    async_wrapper,
    sync_method,
    async_method,
    tap_wrapper,
    tapped_method,
    plain_function,
)


def _forget_own_frames(exc: BaseException) -> None:
    """Take the frames of this module's wrappers out of the tracebacks of ``exc`` and of the
    exceptions chained to it, before the wrapper handling ``exc`` re-raises it (a bare
    ``raise`` adds no entry for the frame it runs in).

    A client that keeps an exception in a local of a frame its traceback holds (urllib3's
    ``urlopen``, aiohttp's connector) makes a cycle that the cyclic collector frees; every
    frame in that traceback waits with it, hooks' frames, arguments and bound methods
    included. Without them the cycle is the client's own, as large as without the plugin, and
    the program's traceback reads as it would without the plugin.
    """
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        head = current.__traceback__
        while head is not None and head.tb_frame.f_code in _OWN_CODE:
            if current is not exc:  # the frame handling ``exc`` is still running
                head.tb_frame.clear()
            head = head.tb_next
        current.__traceback__ = head
        _unlink(head)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        pending.extend(getattr(current, "exceptions", ()))  # an ExceptionGroup's members


def _unlink(entry: TracebackType | None) -> None:
    """Splice the entries of this module's frames out of the traceback after ``entry``, and
    clear those frames' locals (they have returned: the client's frames below them still
    name them as their callers, so the frames themselves stay while the traceback does)."""
    while entry is not None:
        following = entry.tb_next
        while following is not None and following.tb_frame.f_code in _OWN_CODE:
            following.tb_frame.clear()
            following = following.tb_next
        if entry.tb_next is not following:
            entry.tb_next = following
        entry = following
