"""The one patching layer: every hook of every adapter goes through it.

An adapter writes its hooks as plain callbacks (``_hooks``: :class:`Hook`, :class:`Tap`); a
:class:`PatchSet` installs them as guarded, faithful wrappers (``_wrappers``) and takes them out
again:

- **Degrading, never raising.** Hooks are installed in groups, one group per capability (a
  phase, the request span itself). A group whose target is missing (the client library
  changed) is not installed, and the adapter reports what is lost; a missing *essential*
  group turns the whole client off. ``instrument()`` never raises for it.
- **Stacking.** wrapt-based instrumentations (the OpenTelemetry contrib ones) unwrap by putting
  back the ``__wrapped__`` of whatever is on top. So our wrapper goes *beneath* any wrapt proxy
  already installed, and is spliced out of the chain on restore, wherever it sits: either side
  can be uninstrumented first and the other keeps working. A wrapper that cannot be reached any
  more (someone replaced the attribute) is switched off instead, so nothing of it acts.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import sys
from collections.abc import Sequence
from typing import Any, Final

import wrapt

from llm_latency.adapters._hooks import FaultReporter, Hook, Tap
from llm_latency.adapters._wrappers import (
    Switch,
    async_method,
    async_wrapper,
    plain_function,
    sync_method,
    sync_wrapper,
    tap_wrapper,
    tapped_method,
)

_MISSING: Final = object()
#: The base class of wrapt's proxies (``BaseObjectProxy`` from wrapt 2, ``ObjectProxy`` before).
_PROXY: Final[type[Any]] = getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)


class Unavailable(Exception):
    """An adapter cannot observe its client at all (an essential hook's target is missing)."""

    def __init__(self, lost: Sequence[str]) -> None:
        super().__init__("; ".join(lost))
        self.lost = list(lost)


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
        self._switch = Switch()
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
            wrapper = tapped_method(target, hook, where, self._report, self._switch)
        elif isinstance(hook, Hook) and method and inspect.isfunction(target):
            twin = async_method if inspect.iscoroutinefunction(target) else sync_method
            wrapper = twin(target, hook, where, self._report, self._switch)
        else:
            if isinstance(hook, Tap):
                wrap = tap_wrapper(hook, where, self._report, self._switch)
            elif inspect.iscoroutinefunction(function):
                wrap = async_wrapper(hook, where, self._report, self._switch)
            else:
                wrap = sync_wrapper(hook, where, self._report, self._switch)
            if inspect.isfunction(target):
                wrapper = plain_function(target, wrap)
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
