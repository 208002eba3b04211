"""A forked worker records the attribute sets its parent recorded before the fork: the parent
(``llm_latency.instrument()``, the SDK set up by llm-latency from ``OTEL_*`` at the first
request) calls the LLM server at URL twice, then a multiprocessing fork child calls it N times,
the same request: every ``http.client.request.duration`` record reaches the collector, the
parent's 2 and the child's N.

The parent instruments a second time once the SDK is set up (``uninstrument()``, then
``instrument()``): the first instrumentation's meter was the API's proxy (no provider was set
when it started), the second's is the SDK's, whose histograms llm-latency records into directly
(``HistogramRecorder``), as it does for any program that sets its providers up first.

    python tests/programs/fork_records.py URL N
"""

from __future__ import annotations

import multiprocessing
import sys

import requests

import llm_latency

llm_latency.instrument()


def calls(url: str, n: int) -> None:
    """N calls, in the child."""
    for _ in range(n):
        requests.get(url, timeout=10).raise_for_status()


def main(url: str, n: int) -> None:
    requests.get(url, timeout=10).raise_for_status()  # llm-latency sets the SDK up
    llm_latency.uninstrument()
    llm_latency.instrument()
    requests.get(url, timeout=10).raise_for_status()  # the attribute set the child records
    child = multiprocessing.get_context("fork").Process(target=calls, args=(url, n))
    child.start()
    child.join(60)
    print("EXITCODE", child.exitcode, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
