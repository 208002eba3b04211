"""Replacing attributes of third-party classes and modules, and putting them back."""

from __future__ import annotations

from typing import Any

_MISSING = object()


class Patches:
    """A set of attribute replacements that :meth:`restore` undoes, newest first."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def replace(self, owner: Any, name: str, replacement: Any) -> Any:
        """Set ``owner.name`` to ``replacement``; return the original attribute."""
        own = owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else _MISSING
        original = getattr(owner, name)
        self._saved.append((owner, name, own))
        setattr(owner, name, replacement)
        return original

    def restore(self) -> None:
        """Put every replaced attribute back as it was (or delete one that was inherited)."""
        while self._saved:
            owner, name, own = self._saved.pop()
            if own is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, own)
