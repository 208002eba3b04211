"""What ``llm-latency probe`` is asked to do, checked before any request is sent: the URLs,
headers, body, ``--dns`` server and ``--html`` file. Each problem is one :class:`CLIError`
line, never a failure halfway through a run."""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from llm_latency.cli.errors import CLIError
from llm_latency.cli.redaction import scrub

DEFAULT_MODEL = "gpt-4o-mini"
_LLM_ROUTES = ("/chat/completions", "/completions", "/responses", "/messages")


@dataclass
class ProbeRequest:
    """What each probe request sends."""

    method: str
    headers: list[tuple[str, str]]
    body: bytes | None

    def asks_to_stream(self) -> bool:
        """Whether the body asks for a streamed answer (``"stream": true``): set by
        ``--stream`` or by the ``-d`` body itself, which ``--stream`` never overrides."""
        try:
            given = json.loads(self.body) if self.body is not None else None
        except ValueError:
            return False
        return isinstance(given, dict) and given.get("stream") is True


def parse_url(url: str) -> str:
    """The URL if it is an absolute http(s) URL with a host, else a CLIError (which shows the
    URL without its secrets)."""
    shown = repr(scrub(url, [url]))
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise CLIError(f"malformed URL {shown}: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise CLIError(f"malformed URL {shown}: it must start with http:// or https://")
    if not parts.hostname:
        raise CLIError(f"malformed URL {shown}: no host")
    if port == 0:
        raise CLIError(f"malformed URL {shown}: port 0")
    return url


def parse_header(raw: str) -> tuple[str, str]:
    """``'Name: value'`` as a (name, value) pair, else a CLIError."""
    name, colon, value = raw.partition(":")
    if not colon or not name.strip() or any(c.isspace() for c in name.strip()):
        raise CLIError(f"header {raw!r} is not 'Name: value'")
    return name.strip(), value.strip()


def parse_dns(server: str) -> str:
    """``--dns``: an IP address with an optional port (``1.1.1.1``, ``127.0.0.1:5353``,
    ``[::1]:53``, ``::1``), as aiodns takes it; else a CLIError."""
    problem = CLIError(f"--dns {server!r} is not HOST[:PORT] with an IP address as HOST")
    host, port = server, ""
    if server.startswith("["):
        host, bracket, port = server[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            raise problem
        port = port[1:]
    elif server.count(":") == 1:
        host, _, port = server.partition(":")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise problem from None
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise problem
    return server


def check_writable(path: str) -> None:
    """A CLIError now, before the run, if ``path`` cannot be written (``--html``)."""
    target = Path(path)
    folder = target.parent
    if not folder.is_dir():
        raise CLIError(f"cannot write {path}: no directory {folder}")
    if target.is_dir():
        raise CLIError(f"cannot write {path}: it is a directory")
    if not os.access(target if target.exists() else folder, os.W_OK):
        raise CLIError(f"cannot write {path}: permission denied")


def read_body(data: str | None) -> bytes | None:
    """``-d``: the text itself, or ``@file``'s bytes."""
    if data is None:
        return None
    if data.startswith("@"):
        path = Path(data[1:])
        try:
            return path.read_bytes()
        except OSError as exc:
            raise CLIError(f"cannot read {path}: {exc.strerror or exc}") from None
    return data.encode()


def _streamed(body: bytes) -> bytes:
    """The body with ``"stream": true`` added (kept when it sets ``stream`` itself); a CLIError
    when it is not a JSON object."""
    try:
        given = json.loads(body)
    except ValueError:
        given = None
    if not isinstance(given, dict):
        raise CLIError('--stream sets "stream": true in a JSON object body; the -d body is not one')
    if "stream" in given:
        return body
    given["stream"] = True
    return json.dumps(given).encode()


def _with_usage(body: bytes) -> bytes:
    """The body with ``"stream_options": {"include_usage": true}`` (kept when it sets
    ``stream_options`` itself)."""
    given = json.loads(body)  # a JSON object: _streamed or the default body made it
    if "stream_options" not in given:
        given["stream_options"] = {"include_usage": True}
    return json.dumps(given).encode()


def build_request(
    url: str,
    method: str | None,
    raw_headers: tuple[str, ...],
    data: str | None,
    stream: bool,
    model: str,
    include_usage: bool = False,
) -> ProbeRequest:
    """The request to send: method, headers (with an API key from the environment when none
    is given), and body (a small completion request for a known LLM route when none is given).
    ``include_usage``: a stream that carries its usage (OpenAI's ``stream_options``)."""
    headers = [parse_header(h) for h in raw_headers]
    body = read_body(data)
    stream = stream or include_usage
    path = urlsplit(url).path
    is_llm = path.endswith(_LLM_ROUTES)
    if body is None and is_llm and (method is None or method.upper() == "POST"):
        payload: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 16,
        }
        if stream:
            payload["stream"] = True
        body = json.dumps(payload).encode()
    elif body is not None and stream:
        body = _streamed(body)
    if body is not None and include_usage:
        body = _with_usage(body)
    names = {name.lower() for name, _ in headers}
    if body is not None and "content-type" not in names:
        headers.append(("Content-Type", "application/json"))
    if "authorization" not in names and "x-api-key" not in names:
        if path.endswith("/messages") and os.environ.get("ANTHROPIC_API_KEY"):
            headers.append(("x-api-key", os.environ["ANTHROPIC_API_KEY"]))
            if "anthropic-version" not in names:
                headers.append(("anthropic-version", "2023-06-01"))
        elif os.environ.get("OPENAI_API_KEY"):
            headers.append(("Authorization", f"Bearer {os.environ['OPENAI_API_KEY']}"))
    chosen = (method or ("POST" if body is not None else "GET")).upper()
    return ProbeRequest(chosen, headers, body)
