"""What the CLI prints about a URL: its redacted form (``llm_latency.urls.redact``), never its
user info or the values of its secret query parameters. That holds for the report (text, JSON,
HTML), for error lines, whose text often comes from a client library that echoes the URL or its
path and query, and for log lines (the OTLP exporter logs the endpoint's path and query)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Final
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlsplit

from llm_latency.urls import REDACTED, SECRET_QUERY_PARAMS, redact

#: ``scheme://user:password@``: the user info of any URL in a text.
_USER_INFO: Final = re.compile(r"(?<=://)[^/\s@?#'\"<>]*@")
#: ``name=value`` for every secret query parameter name (not inside a longer name).
_SECRET_PAIR: Final = re.compile(
    r"(?i)(?<![\w.-])("
    + "|".join(re.escape(name) for name in sorted(SECRET_QUERY_PARAMS, key=len, reverse=True))
    + r")=[^&#;\s'\"<>),\]]*"
)
#: A known secret value shorter than this is not replaced on its own (only in URL form): a
#: password "a" would otherwise turn every "a" of a message into REDACTED.
_MIN_VALUE: Final = 4


def shown(urls: Iterable[str]) -> dict[str, str]:
    """What to call each URL in a report: its redacted form. Distinct URLs that redact alike
    (they differ only in a secret) are told apart by `` [2]``, `` [3]``, ..."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for url in urls:
        if url in names:
            continue
        base = name = redact(url)
        number = 1
        while name in taken:
            number += 1
            name = f"{base} [{number}]"
        names[url] = name
        taken.add(name)
    return names


def _secret_values(url: str) -> set[str]:
    try:
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
        pairs = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return set()
    raw = {*userinfo.split(":", 1), *(v for k, v in pairs if k.lower() in SECRET_QUERY_PARAMS)}
    values: set[str] = set()
    for value in raw:
        values |= {value, unquote(value), quote(value, safe=""), quote_plus(value)}
    return {value for value in values if len(value) >= _MIN_VALUE}


def scrub(text: str, urls: Iterable[str] = ()) -> str:
    """``text`` with no secret of a URL in it: each of ``urls`` replaced by its redacted form,
    then any ``//user:password@`` and ``secret_param=value`` left (a client's message may carry
    the URL's path and query only), then the known secret values of ``urls`` wherever they are."""
    urls = sorted(set(urls), key=len, reverse=True)
    for url in urls:
        text = text.replace(url, redact(url))
    text = _USER_INFO.sub(f"{REDACTED}:{REDACTED}@", text)
    text = _SECRET_PAIR.sub(lambda match: f"{match.group(1)}={REDACTED}", text)
    values: set[str] = set()
    for url in urls:
        values |= _secret_values(url)
    for value in sorted(values - {REDACTED}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


class ScrubbingFormatter(logging.Formatter):
    """Log lines (message and traceback) as ``scrub`` leaves them."""

    def __init__(self, urls: Iterable[str] = ()) -> None:
        super().__init__("%(message)s")
        self.urls = tuple(urls)

    def format(self, record: logging.LogRecord) -> str:
        """The formatted record, scrubbed."""
        return scrub(super().format(record), self.urls)


@contextmanager
def scrubbed_logging(urls: Iterable[str] = ()) -> Iterator[None]:
    """For the duration, warnings and errors logged anywhere go to stderr scrubbed (in place of
    logging's last-resort handler, which prints them as they are)."""
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(ScrubbingFormatter(urls))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
