"""The rules about requests that failed: what failed, where, how often, and what to do.

A failure is never diagnosed as slowness: the latency rules read only the attempts that
succeeded, and every failed attempt comes here, sorted into one kind by the phase it failed in
and its ``error.type`` (or its 5xx status). Rate limits (429) have a rule of their own, which
counts the time the refusals and the backoffs cost (:mod:`~llm_latency.diagnosis.rate_limits`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from llm_latency.diagnosis.findings import Evidence, Finding
from llm_latency.diagnosis.measured import attempts as all_attempts
from llm_latency.diagnosis.records import Attempt, Call

#: a failure finding: at least this share of the attempts failed that way.
FAILED_MIN_SHARE: Final = 0.05

#: The rule ids of the failure findings (rate limits included), ranked before the latency ones.
FAILURE_RULES: Final = (
    "dns-failure",
    "connect-failure",
    "tls-failure",
    "timeouts",
    "connection-reset",
    "server-errors",
    "failed-requests",
    "rate-limits",
)

_TIMEOUT_WORDS = ("Timeout", "CancelledError")


def kind_of(attempt: Attempt) -> str | None:
    """The failure rule an attempt belongs to, or None when it did not fail (a 429 is the
    rate-limit rule's)."""
    if attempt.succeeded or attempt.status == 429:
        return None
    error = attempt.error or ""
    where = attempt.failed_phase
    if not error and attempt.status is not None:
        return "server-errors" if attempt.status >= 500 else "failed-requests"
    if any(word in error for word in _TIMEOUT_WORDS):
        return "timeouts"
    if where == "dns" or "NameResolution" in error or "gaierror" in error:
        return "dns-failure"
    if where == "tls" or "Certificate" in error or "SSL" in error:
        return "tls-failure"
    if where in ("proxy", "connect") or "Refused" in error or "NewConnection" in error:
        return "connect-failure"
    if where in ("send", "wait", "receive") or "Disconnect" in error or "Payload" in error:
        return "connection-reset"
    return "failed-requests"


def _what(failed: Sequence[Attempt]) -> str:
    """``ClientConnectorCertificateError: 6`` for the errors (or statuses) seen, most first."""
    counts: dict[str, int] = {}
    for attempt in failed:
        name = attempt.error or str(attempt.status)
        counts[name] = counts.get(name, 0) + 1
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{name} \u00d7 {n}" for name, n in ordered)


def _retries(calls: Sequence[Call], rule: str) -> str:
    """What became of the calls with such a failure: retried to success, or failed."""
    hit = [c for c in calls if any(kind_of(a) == rule for a in c.attempts)]
    recovered = sum(1 for c in hit if c.attempts[-1].succeeded)
    if not recovered:
        return f"{len(hit)} {'call' if len(hit) == 1 else 'calls'} failed"
    return f"{recovered} of {len(hit)} calls succeeded on a retry"


#: Per failure kind: how it reads, and what to do.
_TEXT: Final = {
    "dns-failure": (
        "the host's name could not be resolved",
        "check the host name and this machine's resolver (/etc/resolv.conf, the proxy's NO_PROXY)",
    ),
    "connect-failure": (
        "no connection could be opened (refused or unreachable: nothing listens there, or a "
        "firewall or proxy is in the way)",
        "check the URL's host and port, that the server is up, and the proxy settings "
        "(HTTPS_PROXY, NO_PROXY)",
    ),
    "tls-failure": (
        "the TLS handshake failed",
        "trust the server's CA (probe --ca-file, SSL_CERT_FILE, or the client's ssl context "
        "or verify=) and check that the URL's host name is on the certificate",
    ),
    "timeouts": (
        "the requests timed out",
        "raise the timeout if the answers are long (or stream them, so the read timeout "
        "bounds the pause between chunks, not the whole answer), and retry on a timeout",
    ),
    "connection-reset": (
        "the connection was cut before the response was whole",
        "retry such calls (the SDKs do; a loop of one's own can use llm_latency.retry); if "
        "the cut comes after the same time every time, an idle timeout of a proxy or load "
        "balancer is the usual cause",
    ),
    "server-errors": (
        "the server answered with an error (5xx)",
        "retry with backoff (the SDKs do; a loop of one's own can use llm_latency.retry) and "
        "check the provider's status page; nothing on this side is slow",
    ),
    "failed-requests": (
        "the requests failed",
        "read the error: the server refused the request (4xx) or the client gave up",
    ),
}


def _failure(calls: Sequence[Call], rule: str) -> Finding | None:
    everything = all_attempts(calls)
    failed = [a for a in everything if kind_of(a) == rule]
    share = len(failed) / max(len(everything), 1)
    if not failed or share < FAILED_MIN_SHARE:
        return None
    where = sorted({a.failed_phase for a in failed if a.failed_phase})
    phases = "+".join(f"http.{p}" for p in where) or "response"
    what, fix = _TEXT[rule]
    if rule == "tls-failure" and any("Certificate" in (a.error or "") for a in failed):
        what = "the server's certificate was not trusted: the TLS handshake failed"
    elif rule == "timeouts" and where:
        what = f"the requests timed out in {', '.join(where)}"
    evidence = Evidence.of(
        phases,
        [a.duration for a in failed],
        share,
        len(everything),
        share_of="the requests",
        min_share=FAILED_MIN_SHARE,
    )
    return Finding(
        rule=rule,
        cause=f"{len(failed)} of {len(everything)} requests failed: {what} ({_what(failed)}); "
        f"{_retries(calls, rule)}",
        evidence=evidence,
        fix=fix,
        saving=None,
    )


def dns_failure(calls: Sequence[Call]) -> Finding | None:
    """Requests that failed resolving the host's name."""
    return _failure(calls, "dns-failure")


def connect_failure(calls: Sequence[Call]) -> Finding | None:
    """Requests that could not open a connection: refused, unreachable."""
    return _failure(calls, "connect-failure")


def tls_failure(calls: Sequence[Call]) -> Finding | None:
    """Requests whose TLS handshake failed: an untrusted certificate, a wrong host name."""
    return _failure(calls, "tls-failure")


def timeouts(calls: Sequence[Call]) -> Finding | None:
    """Requests that timed out, in whatever phase."""
    return _failure(calls, "timeouts")


def connection_reset(calls: Sequence[Call]) -> Finding | None:
    """Requests whose connection was cut while sending, waiting or reading the response."""
    return _failure(calls, "connection-reset")


def server_errors(calls: Sequence[Call]) -> Finding | None:
    """Requests answered with a 5xx."""
    return _failure(calls, "server-errors")


def failed_requests(calls: Sequence[Call]) -> Finding | None:
    """Any other failure: a 4xx other than 429, an error of no known kind."""
    return _failure(calls, "failed-requests")
