"""Advice that names the API of the client in use: the attempts carry the client library that
made them (``llm_latency.client``), and the calls the SDK that opened them (``openai POST
/chat/completions``), so a fix names the object to reuse or the setting to turn, with its value,
as a :class:`~llm_latency.diagnosis.findings.Fix` a program can apply by rote.

urllib3's attempts are requests' too (requests runs on it); their fixes name requests' API,
which is what most programs call, and say urllib3's beside it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Final

from llm_latency.diagnosis.findings import CONFIGURE, DECORATE, REUSE, Fix
from llm_latency.diagnosis.records import Attempt, Call

#: Per client library, the setting that bounds its connection pool (when the client is not
#: known, the fix names them all).
POOL_KNOBS: Final = {
    "aiohttp": "aiohttp: TCPConnector(limit=..., limit_per_host=...)",
    "httpx": "httpx: Limits(max_connections=...)",
    "httpx2": "httpx2: Limits(max_connections=...)",
    "urllib3": "requests: HTTPAdapter(pool_maxsize=..., pool_block=True) mounted on the "
    "Session; urllib3: PoolManager(maxsize=...)",
}

#: Per client library or SDK: the library a fix names, the object to create once and reuse,
#: and what to say beside it.
CLIENTS: Final = {
    "aiohttp": ("aiohttp", "aiohttp.ClientSession", "(with its TCPConnector)"),
    "httpx": ("httpx", "httpx.Client", "(httpx.AsyncClient in async code)"),
    "httpx2": ("httpx2", "httpx2.Client", "(httpx2.AsyncClient in async code)"),
    "urllib3": ("requests", "requests.Session", "(plain urllib3: one urllib3.PoolManager)"),
    "openai": ("openai", "openai.OpenAI", "(openai.AsyncOpenAI in async code)"),
    "anthropic": ("anthropic", "anthropic.Anthropic", "(anthropic.AsyncAnthropic in async code)"),
}

#: The SDKs whose calls llm-latency opens a span for (``openai chat.completions``, with
#: ``llm_latency.sdk``): their client holds the HTTP client and its pool.
SDKS: Final = ("openai", "anthropic")

#: aiohttp's ``ttl_dns_cache`` when the program does not set it (s).
AIOHTTP_DNS_TTL: Final = 10


def client_of(attempts: Iterable[Attempt]) -> str | None:
    """The client library most of the attempts name (``llm_latency.client``), or None."""
    counts = Counter(a.client for a in attempts if a.client)
    return counts.most_common(1)[0][0] if counts else None


def sdk_of(calls: Sequence[Call]) -> str | None:
    """The SDK every one of the calls was made through, when llm-latency opened their spans
    (their ``llm_latency.sdk``)."""
    for sdk in SDKS:
        if calls and all(call.sdk == sdk for call in calls):
            return sdk
    return None


def pool_knob(attempts: Iterable[Attempt]) -> str:
    """The pool setting of the clients the attempts came from; every client's when the spans
    do not say which."""
    used = sorted({a.client for a in attempts if a.client} & POOL_KNOBS.keys())
    return "; ".join(POOL_KNOBS[name] for name in (used or POOL_KNOBS))


# -- one client for the program's life -----------------------------------------------------------


def reuse_fix(calls: Sequence[Call], attempts: Sequence[Attempt]) -> Fix | None:
    """The client object to create once and reuse: the SDK's client when the calls went
    through one, else the client library's; None when the spans name neither."""
    name = sdk_of(calls) or client_of(attempts)
    if name not in CLIENTS:
        return None
    client, api, _ = CLIENTS[name]
    return Fix(client, api, REUSE)


def reuse_text(fix: Fix | None) -> str:
    """The fix of connections opened again and again, in words."""
    if fix is None:
        return (
            "reuse one client for all requests (one aiohttp.ClientSession, httpx.Client, "
            "requests.Session or SDK client, created once) so connections are kept alive"
        )
    beside = next((note for client, api, note in CLIENTS.values() if api == fix.api), "")
    return (
        f"reuse one client for all requests: {fix.text()} {beside}, so its connections are kept "
        "alive and reused (a Connection: keep-alive header alone does not do it)"
    )


def closing_setting(attempts: Sequence[Attempt]) -> str | None:
    """The client setting that closed most of the attempts' connections after them
    (``llm_latency.connection.closed_by``), or None."""
    counts = Counter(a.closed_by for a in attempts if a.closed_by)
    if not counts:
        return None
    setting, count = counts.most_common(1)[0]
    return setting if 2 * count >= len(attempts) else None


def keep_alive_fix(attempts: Sequence[Attempt], setting: str, needed: int) -> Fix | None:
    """The setting that keeps the connections open instead of ``setting``, which closes each
    after its request (``needed``: the connections the concurrency needs); None for a request
    header, which no client setting turns off."""
    name = client_of(attempts)
    if setting == "force_close=True":
        return Fix("aiohttp", "aiohttp.TCPConnector", CONFIGURE, (("force_close", False),))
    if setting == "max_keepalive_connections=0" and name in ("httpx", "httpx2"):
        settings = (("max_keepalive_connections", max(needed, 1)),)
        return Fix(name, f"{name}.Limits", CONFIGURE, settings)
    return None


def keep_alive_text(setting: str, fix: Fix | None) -> str:
    """The fix of a client that is reused but closes its connections, in words: it names the
    setting at fault (reusing the client is what the program already does)."""
    if fix is None:
        return (
            f"stop sending {setting} on every request (from the program's or its client's "
            "default headers): the client is reused, but the header makes the server close the "
            "connection after each answer, so the next request opens one again"
        )
    why = (
        'against "Server disconnected" on an idle connection, retry that error or set '
        "keepalive_timeout below the server's idle timeout instead"
        if setting == "force_close=True"
        else "the pool then keeps that many idle connections for the next requests"
    )
    return (
        f"the client is reused, but {setting} closes each connection after its request: "
        f"{fix.text()} keeps them alive ({why})"
    )


# -- the pool's limits ---------------------------------------------------------------------------


def pool_fix(attempts: Sequence[Attempt], per_host: int, every_host: int) -> Fix | None:
    """The pool's settings that let ``per_host`` requests to one host (and ``every_host`` to
    all hosts together) run at once, for the client the attempts came from."""
    every_host = max(every_host, per_host)
    name = client_of(attempts)
    if name == "aiohttp":
        limits = (("limit", every_host), ("limit_per_host", per_host))
        return Fix("aiohttp", "aiohttp.TCPConnector", CONFIGURE, limits)
    if name in ("httpx", "httpx2"):
        limits = (("max_connections", every_host), ("max_keepalive_connections", every_host))
        return Fix(name, f"{name}.Limits", CONFIGURE, limits)
    if name == "urllib3":
        return Fix(
            "requests", "requests.adapters.HTTPAdapter", CONFIGURE, (("pool_maxsize", per_host),)
        )
    return None


def pool_text(fix: Fix | None, attempts: Sequence[Attempt], in_use: int, wanted: int) -> str:
    """The pool's fix in words."""
    instead = f"or send at most {in_use} at once"
    if fix is None:
        return (
            f"raise the pool's limit ({pool_knob(attempts)}) from {in_use} to {wanted}, the "
            f"concurrency seen, {instead}"
        )
    why = {
        "aiohttp.TCPConnector": "limit bounds the connections to every host together, "
        "limit_per_host those to one: the lower one caps the pool, so both must allow it",
        "requests.adapters.HTTPAdapter": "mounted on the requests.Session for the URL's scheme, "
        f"pool_block as before; plain urllib3: PoolManager(maxsize={wanted})",
    }.get(fix.api, "the client's limits=: max_keepalive_connections keeps them open for the next "
          "requests")  # fmt: skip
    return (
        f"raise the pool's limits from {in_use} to {wanted}, the requests in flight at once: "
        f"{fix.text()} ({why}); {instead}"
    )


# -- DNS and retries -----------------------------------------------------------------------------


def dns_cache_fix(attempts: Sequence[Attempt], longest_gap: float) -> Fix | None:
    """aiohttp's DNS cache on, for twice the longest time between an answer and a lookup that
    repeated it (``longest_gap``, s; aiohttp's default at least); None for clients with no DNS
    cache of their own (httpx, requests: the resolver's is theirs)."""
    if client_of(attempts) != "aiohttp":
        return None
    ttl = max(AIOHTTP_DNS_TTL, math.ceil(longest_gap * 2))
    settings = (("use_dns_cache", True), ("ttl_dns_cache", ttl))
    return Fix("aiohttp", "aiohttp.TCPConnector", CONFIGURE, settings)


def retry_fix(attempts: int) -> Fix:
    """``llm_latency.retry``, which waits what the server asks, allowing ``attempts``."""
    return Fix("llm_latency", "llm_latency.retry", DECORATE, (("attempts", attempts),))
