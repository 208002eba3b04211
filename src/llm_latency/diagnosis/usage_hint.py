"""The one hint for streams that carried no usage: without it a stream has no token counts and
no time per output token, and the token rules say nothing of it. OpenAI's chat completions (and
the servers compatible with them) send the usage in a stream only when the request asks;
llm-latency never changes a request to ask (the program would receive one more chunk, with no
choices), so the hint names the option for the program to set."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Protocol

#: The request option that turns a stream's usage on, as JSON.
INCLUDE_USAGE: Final = '"stream_options": {"include_usage": true}'


class Answered(Protocol):
    """An attempt as a record or as probe's result: whether its stream had no usage."""

    @property
    def usage_unknown(self) -> bool:
        """A stream with content and no usage."""


def usage_hint(attempts: Iterable[Answered], how: str = "") -> str | None:
    """``2 streams carried no usage: ...``, or None when every stream with content carried its
    usage. ``how``: what asks for it where the hint is read (probe: its option)."""
    missing = sum(1 for attempt in attempts if attempt.usage_unknown)
    if not missing:
        return None
    streams = "1 stream" if missing == 1 else f"{missing} streams"
    return (
        f"{streams} carried no usage: no token counts and no time per output token; ask for it "
        f"in the request: {INCLUDE_USAGE} (OpenAI's chat completions and the servers "
        f"compatible with them){how}"
    )
