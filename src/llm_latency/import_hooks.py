"""One import hook per module per process.

llm-latency hooks a library when the program imports it (wrapt's post-import hooks). wrapt's
registry is process-wide and has no way out: a hook waits there, with everything it holds, until
its module is imported, which may be never. So each hook here is registered once per process
(per module and function), and is a function of a module that holds nothing: what it does when
the module is imported, it reads then (the live instrumentation, if any). Instrumenting and
uninstrumenting a thousand times leaves one hook per module, and nothing of an instrumentation
that has ended.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from types import ModuleType

import wrapt

from llm_latency import forks
from llm_latency.live_state import register

#: What runs when a module is imported: a plain function of a module, holding nothing.
Hook = Callable[[ModuleType], object]

_lock = forks.lock()
#: The hooks registered with wrapt whose module has not been imported yet.
_waiting: set[tuple[str, Hook]] = set()
register("import_hooks", lambda: len(_waiting))


def when_imported(module: str, hook: Hook) -> None:
    """Call ``hook(module)`` once ``module`` is imported (now, if it already is). The same hook
    for the same module is registered once, however often this is called."""
    key = (module, hook)
    with _lock:
        if key in _waiting:
            return
        _waiting.add(key)
    wrapt.register_post_import_hook(partial(_imported, key), module)


def _imported(key: tuple[str, Hook], module: ModuleType) -> None:
    # wrapt drops a hook once it has run: a later import (after the module was removed from
    # sys.modules) needs a new one.
    with _lock:
        _waiting.discard(key)
    key[1](module)
