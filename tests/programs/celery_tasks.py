"""A Celery app as a new user writes it: ``llm_latency.instrument()`` at import, the SDK set up
by nobody (llm-latency then sets it up from ``OTEL_*``), a task that calls the LLM server.

    BROKER=redis://127.0.0.1:PORT/0 celery -A tests.programs.celery_tasks worker --pool prefork
"""

from __future__ import annotations

import os

import requests
from celery import Celery

import llm_latency

llm_latency.instrument()

app = Celery("celery_tasks", broker=os.environ["BROKER"])


@app.task(ignore_result=True)  # type: ignore[untyped-decorator]
def call(url: str) -> int:
    """One call to the LLM server."""
    return requests.get(url, timeout=10).status_code
