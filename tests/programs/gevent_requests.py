"""requests under gevent's monkey-patching, as Locust runs a locustfile, traced by llm-latency
with the SDK set up from ``OTEL_*`` at the first request (``instrument()``'s default):

    python tests/programs/gevent_requests.py URL USERS

1. USERS greenlets send their first request at once, each on a session (a connection) of its
   own, and read the answer. The first one runs the SDK's set-up, which yields to the others
   (it starts the span processor's export thread, a greenlet here): their requests start while
   the set-up runs.
2. Three streamed responses are abandoned unread and unclosed, each inside a reference cycle
   (as Locust's response and its ``request_meta``), then collected.

The spans go where ``OTEL_TRACES_EXPORTER`` says (the test: the console exporter, on stdout),
flushed at exit. Prints ``DONE`` when the requests are over.
"""

from gevent import monkey

monkey.patch_all()

import gc  # noqa: E402
import sys  # noqa: E402

import gevent  # noqa: E402
import requests  # noqa: E402

import llm_latency  # noqa: E402

ABANDONED = 3


def first_request(url: str) -> None:
    with requests.Session() as session:
        session.post(url, json={}).raise_for_status()


def abandon(session: requests.Session, url: str) -> None:
    response = session.post(url, json={"stream": True}, stream=True)
    response.raise_for_status()
    response.request_meta = {"response": response}  # type: ignore[attr-defined]


def main() -> None:
    url, users = sys.argv[1], int(sys.argv[2])
    llm_latency.instrument(clients=["requests"])
    gevent.joinall([gevent.spawn(first_request, url) for _ in range(users)], raise_error=True)
    with requests.Session() as session:
        for _ in range(ABANDONED):
            abandon(session, url)
        gc.collect()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
