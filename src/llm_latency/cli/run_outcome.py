"""How a probe run ends: its exit code, and the lines on stderr that say why.

A request failed when it got no successful answer, however it failed: no response (a refused
connection, a name that does not resolve, a TLS failure, a timeout), an answer that broke off,
or a status of 400 or more (a 429 too). The probe measured each of them either way; the exit
code says whether the endpoints answered: 0 when every request succeeded, 1 when some URL got
no successful answer at all, 3 when some requests failed but every URL answered at least once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llm_latency.cli.results import RequestResult, succeeded

#: Every request of the run succeeded.
ALL_ANSWERED = 0
#: Some URL got no successful answer (every request to it failed), or the input was wrong.
FAILED = 1
#: Some requests failed, but every URL answered at least once.
SOME_FAILED = 3


def status_lines(name: str, results: Sequence[RequestResult]) -> list[str]:
    """``URL: 2 of 4 requests got an error status (429: 2)``, or nothing when none did. The
    requests that got no response are said by their errors' own lines."""
    requests = [r for r in results if r.kind == "request"]
    statuses: dict[int, int] = {}
    for result in requests:
        if result.status is not None and result.status >= 400 and result.error is None:
            statuses[result.status] = statuses.get(result.status, 0) + 1
    if not statuses:
        return []
    counts = ", ".join(f"{status}: {n}" for status, n in sorted(statuses.items()))
    got = sum(statuses.values())
    return [f"{name}: {got} of {len(requests)} requests got an error status ({counts})"]


def exit_code(runs: Mapping[str, tuple[Sequence[RequestResult], int]]) -> int:
    """The run's exit code from each URL's results and its count of errors raised (a request
    can fail before a span records it, with no result)."""
    code = ALL_ANSWERED
    for results, errors in runs.values():
        requests = [r for r in results if r.kind == "request"]
        answered = sum(1 for r in requests if succeeded(r))
        if answered == 0:
            return FAILED
        if errors or answered < len(requests):
            code = SOME_FAILED
    return code
