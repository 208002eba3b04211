"""A job that calls the LLM server at URL N times in other processes, or a plain program that
waits for SIGTERM, as a new user writes them: ``llm_latency.instrument()`` at import, the SDK
set up by nobody (llm-latency then sets it up from ``OTEL_*``).

    python tests/programs/pool_job.py spawn|fork URL N   ProcessPoolExecutor, 2 processes
    python tests/programs/pool_job.py exit URL N         a fork Process that ends with sys.exit(3)
    python tests/programs/pool_job.py plain URL N        N calls, prints READY, waits for SIGTERM
    python tests/programs/pool_job.py flush URL N        N calls, llm_latency.flush(), prints
                                                         FLUSHED, its result and its seconds,
                                                         then waits (frozen) to be killed
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import requests

import llm_latency

llm_latency.instrument()


def call(url: str) -> int:
    """One call to the LLM server."""
    return requests.get(url, timeout=10).status_code


def calls_then_exit(url: str, n: int) -> None:
    """N calls, then ``sys.exit(3)``: what a worker does when it gives up."""
    for _ in range(n):
        call(url)
    sys.exit(3)


def main(mode: str, url: str, n: int) -> None:
    if mode in ("spawn", "fork"):
        context = multiprocessing.get_context(mode)
        with ProcessPoolExecutor(2, mp_context=context) as pool:
            assert list(pool.map(call, [url] * n)) == [200] * n
            print("DONE", time.monotonic(), flush=True)  # the children end from here
        return
    elif mode == "exit":
        process = multiprocessing.get_context("fork").Process(target=calls_then_exit, args=(url, n))
        process.start()
        process.join()
        print("EXITCODE", process.exitcode, flush=True)
    elif mode in ("plain", "flush"):
        for _ in range(n):
            call(url)
        if mode == "flush":
            start = time.monotonic()
            flushed = llm_latency.flush(timeout=1.0)
            print("FLUSHED", flushed, time.monotonic() - start, flush=True)
        else:
            print("READY", flush=True)
        while True:
            time.sleep(1)
    print("DONE", time.monotonic(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
