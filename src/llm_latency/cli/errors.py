"""Errors the CLI reports as one clear line (never a traceback)."""

from __future__ import annotations

import socket
import ssl
from urllib.parse import urlsplit

from llm_latency.cli.redaction import scrub


class OutputGone(Exception):
    """The reader of the output went away (``| head``). Not an ``OSError``: click's own
    handling of a broken pipe (which exits with 1, or not at all, by version) never sees it."""


class CLIError(Exception):
    """A problem to report to the user as one line, then exit with ``exit_code`` (1 unless
    said). With ``raw=True`` the message is printed as it is (already one formatted line per
    problem)."""

    def __init__(self, message: str, *, raw: bool = False, exit_code: int = 1) -> None:
        super().__init__(message)
        self.raw = raw
        self.exit_code = exit_code


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def describe(error: BaseException, url: str, timeout: float) -> str:
    """A one-line explanation of why a request to ``url`` failed, with none of the URL's
    secrets (a client's message may echo its path and query)."""
    return scrub(_describe(error, url, timeout), [url])


def _describe(error: BaseException, url: str, timeout: float) -> str:
    parts = urlsplit(url)
    host = parts.hostname or url
    where = f"{host}:{parts.port}" if parts.port else host
    names = {type(e).__name__ for e in _chain(error)}
    chain = _chain(error)
    if (
        any(isinstance(e, socket.gaierror) for e in chain)
        or "ClientConnectorDNSError" in names
        or "NameResolutionError" in names
    ):
        return f"cannot resolve {host}: the name does not resolve"
    if (
        any(isinstance(e, ssl.SSLCertVerificationError) for e in chain)
        or "ClientConnectorCertificateError" in names
    ):
        reason = next(
            (
                message
                for e in chain
                for candidate in (e, getattr(e, "certificate_error", None))
                if (message := getattr(candidate, "verify_message", None))
            ),
            "certificate verify failed",
        )
        return f"TLS failure with {where}: {reason} (use --cacert for a private CA)"
    if any(isinstance(e, ssl.SSLError) for e in chain) or "SSLError" in names:
        return f"TLS failure with {where}: {error}"
    if any(isinstance(e, (TimeoutError, socket.timeout)) for e in chain) or any(
        "Timeout" in name for name in names
    ):
        return f"timed out talking to {where} (after up to {timeout:g} s; see --timeout)"
    if (
        any(isinstance(e, ConnectionRefusedError) for e in chain)
        or "ConnectionRefusedError" in str(error)
        or "Connection refused" in str(error)
    ):
        return f"connection refused by {where}"
    if any(isinstance(e, ConnectionError) for e in chain) or any(
        "Connect" in name or "Disconnected" in name for name in names
    ):
        return f"connection to {where} failed: {error}"
    return f"request to {where} failed: {type(error).__name__}: {error}"
