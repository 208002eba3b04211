"""The one patching layer: every hook of every adapter goes through it.

- **Faithful wrappers.** A hook is installed as a wrapper of the original (below, which kind):
  ``inspect.signature``, ``__name__``, ``__qualname__``, ``__wrapped__`` and coroutine-ness are
  the original's (libraries such as google-genai read the signature of what they call).
- **Guarded plugin code.** A :class:`Hook` is up to three callbacks, ``before`` (may decline the
  call with :data:`SKIP`), ``after`` and ``error``. They run inside ``try`` blocks, the
  program's own call never does: a fault in a callback is logged once and the call goes on as
  if the plugin were not there (``abandon`` lets the adapter end the attempt it was tracking).
- **Degrading, never raising.** Hooks are installed in groups, one group per capability (a
  phase, the request span itself). A group whose target is missing (the client library
  changed) is not installed, and the adapter reports what is lost; a missing *essential*
  group turns the whole client off. ``instrument()`` never raises for it.
- **Plain functions where they can be.** A hook on a plain function (a method in a class, a
  function in a module) is a plain function itself, made with ``functools.update_wrapper``
  (the original's name, signature and ``__wrapped__``; ``async def`` for a coroutine
  function): a wrapt proxy costs about 0.8 µs a call here, more than a :class:`Tap`'s whole
  work on a body chunk. It stacks and is spliced out like a proxy. Other callables (a
  ``staticmethod``, a builtin) get a ``wrapt.FunctionWrapper``.
- **Stacking.** wrapt-based instrumentations (the OpenTelemetry contrib ones) unwrap by putting
  back the ``__wrapped__`` of whatever is on top. So our wrapper goes *beneath* any wrapt proxy
  already installed, and is spliced out of the chain on restore, wherever it sits: either side
  can be uninstrumented first and the other keeps working. A wrapper that cannot be reached any
  more (someone replaced the attribute) is switched off instead, so nothing of it acts.
- **Sync and async twins.** ``_async_wrapper`` is ``_sync_wrapper`` with ``async``/``await``
  added, and a test keeps it so (``tests/test_patching.py`` compares their syntax trees with
  the ``await`` taken out). Two functions of about thirty lines do not earn a code generator
  and its build step, as httpcore's ``unasync`` of whole modules does: the test fails on any
  drift, and both stay plain code to read.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from types import CodeType, TracebackType
from typing import Any, Final

import wrapt

#: What ``before`` returns to let the call through untouched.
SKIP: Final = object()

_MISSING: Final = object()
#: The base class of wrapt's proxies (``BaseObjectProxy`` from wrapt 2, ``ObjectProxy`` before).
_PROXY: Final[type[Any]] = getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)

Before = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]
After = Callable[[Any, Any], Any]
OnError = Callable[[Any, BaseException], None]
Abandon = Callable[[Any], None]
FaultReporter = Callable[[str], None]


class Unavailable(Exception):
    """An adapter cannot observe its client at all (an essential hook's target is missing)."""

    def __init__(self, lost: Sequence[str]) -> None:
        super().__init__("; ".join(lost))
        self.lost = list(lost)


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


class _Switch:
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


def _sync_wrapper(hook: Hook, where: str, report: FaultReporter, switch: _Switch) -> Any:
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


def _tap_wrapper(tap: Tap, where: str, report: FaultReporter, switch: _Switch) -> Any:
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


def _tapped_method(
    function: Any, tap: Tap, where: str, report: FaultReporter, switch: _Switch
) -> Any:
    """The plain function ``function``, set on a class, observed by ``tap``: a plain function
    with the original's name, signature and ``__wrapped__`` that hands its first argument over
    as the instance, as wrapt's proxy would. A closure of its own per kind of tap (it runs per
    body chunk), with no choice left to make per call. A module's function gets the generic
    :func:`_tap_wrapper` through :func:`_plain_function`."""
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


def _plain_function(function: Any, wrap: Any) -> Any:
    """The module function ``function`` hooked by ``wrap`` (a wrapt-style ``wrap(wrapped,
    instance, args, kwargs)``) as a plain function with the original's name, signature,
    ``__wrapped__`` and coroutine-ness. (A function set on a class gets a twin of its own:
    :func:`_sync_method`, :func:`_async_method`, :func:`_tapped_method`.)"""
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


def _async_wrapper(hook: Hook, where: str, report: FaultReporter, switch: _Switch) -> Any:
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


def _sync_method(
    function: Any, hook: Hook, where: str, report: FaultReporter, switch: _Switch
) -> Any:
    """The plain function ``function``, set on a class, hooked by ``hook``: what
    :func:`_plain_function` makes of :func:`_sync_wrapper`, in one frame. The instance is the
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


def _async_method(
    function: Any, hook: Hook, where: str, report: FaultReporter, switch: _Switch
) -> Any:
    """:func:`_sync_method` for a coroutine function (its twin: see the module's docstring)."""
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
    _sync_wrapper,
    _async_wrapper,
    _sync_method,
    _async_method,
    _tap_wrapper,
    _tapped_method,
    _plain_function,
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


def module_installed(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it or its packages (a
    dotted name's packages are looked up on disk, not run)."""
    if module in sys.modules:
        return True
    top, *parts = module.split(".")
    try:
        spec = importlib.util.find_spec(top)
        for depth, _ in enumerate(parts, 1):
            locations = None if spec is None else spec.submodule_search_locations
            if locations is None:
                return False
            name = ".".join([top, *parts[:depth]])
            spec = importlib.machinery.PathFinder.find_spec(name, list(locations))
    except (ImportError, ValueError):
        return False
    return spec is not None


def _resolve_owner(owner: Any) -> Any:
    """``owner`` itself, or the object a ``"module:Qual.Name"`` string names."""
    if not isinstance(owner, str):
        return owner
    module_name, _, path = owner.partition(":")
    found: Any = importlib.import_module(module_name)
    for part in filter(None, path.split(".")):
        found = getattr(found, part)
    return found


def _describe(owner: Any, name: str) -> str:
    if isinstance(owner, str):
        return f"{owner.replace(':', '.')}.{name}"
    module = getattr(owner, "__module__", None) or ""
    qualname = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", "?")
    return f"{module}.{qualname}.{name}" if module else f"{qualname}.{name}"


class _Installed:
    __slots__ = ("name", "original_own", "owner", "wrapper")

    def __init__(self, owner: Any, name: str, original_own: Any, wrapper: Any) -> None:
        self.owner = owner
        self.name = name
        self.original_own = original_own
        self.wrapper = wrapper


Target = tuple[Any, str, "Hook | Tap"]


class PatchSet:
    """The hooks of one adapter: installed by capability, restored together.

    ``report`` is called with a short description of where a fault happened, from inside an
    ``except`` block (it may log the exception).
    """

    def __init__(self, client: str, report: FaultReporter) -> None:
        self.client = client
        self._report = report
        self._switch = _Switch()
        self._installed: list[_Installed] = []
        #: Capabilities not installed, each with the reason (a missing target).
        self.lost: list[str] = []
        #: Every (capability, target) asked for, installed or not: what docs/patching.md lists.
        self.targets: list[tuple[str, str]] = []

    def group(self, capability: str, targets: Sequence[Target]) -> bool:
        """Install every hook of ``capability``, or none of them if any target is missing.

        Returns whether the group was installed; a missing one is added to :attr:`lost`.
        """
        self.targets.extend((capability, _describe(owner, name)) for owner, name, _ in targets)
        resolved: list[tuple[Any, str, Any, Hook | Tap]] = []
        for owner_ref, name, hook in targets:
            try:
                owner = _resolve_owner(owner_ref)
                original = inspect.getattr_static(owner, name)
            except (ImportError, AttributeError):
                self.lost.append(f"{capability} ({_describe(owner_ref, name)} not found)")
                return False
            resolved.append((owner, name, original, hook))
        for owner, name, _original, hook in resolved:
            self._install(owner, name, hook, f"{self.client} {capability}")
        return True

    def _install(self, owner: Any, name: str, hook: Hook | Tap, where: str) -> None:
        own = vars(owner).get(name, _MISSING)
        holder: Any = None
        if own is _MISSING:  # inherited: wrapped on ``owner`` itself, the base left alone
            target = inspect.getattr_static(owner, name)
        else:  # beneath any wrapt proxies already there (see the module docstring)
            target = own
            while isinstance(target, _PROXY):
                holder, target = target, target.__wrapped__
        function = getattr(target, "__func__", target)  # staticmethod: its function
        wrapper: Any
        method = inspect.isclass(owner)
        if isinstance(hook, Tap) and method and inspect.isfunction(target):
            wrapper = _tapped_method(target, hook, where, self._report, self._switch)
        elif isinstance(hook, Hook) and method and inspect.isfunction(target):
            twin = _async_method if inspect.iscoroutinefunction(target) else _sync_method
            wrapper = twin(target, hook, where, self._report, self._switch)
        else:
            if isinstance(hook, Tap):
                wrap = _tap_wrapper(hook, where, self._report, self._switch)
            elif inspect.iscoroutinefunction(function):
                wrap = _async_wrapper(hook, where, self._report, self._switch)
            else:
                wrap = _sync_wrapper(hook, where, self._report, self._switch)
            if inspect.isfunction(target):
                wrapper = _plain_function(target, wrap)
            else:
                wrapper = wrapt.FunctionWrapper(target, wrap)
        if holder is None:
            setattr(owner, name, wrapper)
        else:
            holder.__wrapped__ = wrapper
        self._installed.append(_Installed(owner, name, own, wrapper))

    def installed(self) -> list[tuple[Any, str]]:
        """``(owner, attribute)`` of every hook in place."""
        return [(item.owner, item.name) for item in self._installed]

    def restore(self) -> None:
        """Take every hook out, wherever it now sits in a chain of wrappers, newest first."""
        self._switch.on = False
        while self._installed:
            _remove(self._installed.pop())


def _is(node: Any, wrapper: Any) -> bool:
    """Whether ``node`` is ``wrapper``, or wrapt's bound form of it (what ``getattr`` on the
    class returns, and so what contrib's ``unwrap`` may have put back in its place)."""
    return node is wrapper or getattr(node, "_self_parent", None) is wrapper


def _remove(item: _Installed) -> None:
    owner, name, wrapper = item.owner, item.name, item.wrapper
    current = vars(owner).get(name, _MISSING)
    if _is(current, wrapper):
        if item.original_own is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, wrapper.__wrapped__)
        return
    node = current
    while isinstance(node, _PROXY):
        below = node.__wrapped__
        if _is(below, wrapper):
            node.__wrapped__ = wrapper.__wrapped__
            return
        node = below
    # Not reachable any more: the switch being off makes it a plain pass-through.
