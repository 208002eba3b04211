"""Load-test an OpenAI-compatible endpoint with Locust, every request traced by llm-latency.

Against llm-latency's mock server, with the deploy bundle (deploy/compose) taking the spans and
metrics over OTLP on localhost:4318:

    llm-latency mock-server --port 8000 --ttfb 0.3 --rate-limit-every 20 &
    OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 OTEL_SERVICE_NAME=locust \\
        locust -f examples/locustfile.py --host http://localhost:8000 \\
        --headless -u 50 -r 50 -t 1m --stop-timeout 10

Locust's ``HttpUser`` runs on requests (urllib3), which llm-latency instruments under Locust's
gevent as in a plain program: each request is a span with its phases, and the metrics
(``llm_latency_phase_duration_seconds``, ``llm_latency_rate_limited_total``, ...) reach the
bundle's Prometheus. No OpenTelemetry set-up is needed here: at the first request, llm-latency
sets the SDK up from the ``OTEL_*`` variables (``OTEL_METRICS_EXPORTER=prometheus`` with
``OTEL_EXPORTER_PROMETHEUS_PORT`` serves the metrics for a Prometheus to scrape instead).

``--stop-timeout`` lets each user finish the request it is in when the run ends. Without it,
Locust kills the users mid-request: those requests are not in Locust's statistics, and their
spans end with ``error.type`` ``GreenletExit``.
"""

from locust import HttpUser, between, task
from requests import RequestException

import llm_latency

llm_latency.instrument(clients=["requests"])

BODY = {"model": "mock-gpt", "messages": [{"role": "user", "content": "Say hello."}]}


class ChatUser(HttpUser):
    """Sends chat completions, half of them streamed."""

    wait_time = between(0.5, 1.5)

    @task
    def complete(self) -> None:
        # Locust reads the whole body, and counts a 4xx or 5xx as a failure.
        self.client.post("/v1/chat/completions", json=BODY, name="chat")

    @task
    def stream(self) -> None:
        # Locust's response time for this one is the time to the response headers; the span's
        # http.receive phase, llm_latency.time_to_first_token and, with the usage chunk that
        # include_usage asks for, llm_latency.time_per_output_token tell the rest. A with-block
        # needs catch_response=True, and marks the request itself; every branch reads the body
        # to its end, so the span ends with the stream and the connection goes back to the pool.
        with self.client.post(
            "/v1/chat/completions",
            json={**BODY, "stream": True, "stream_options": {"include_usage": True}},
            stream=True,
            catch_response=True,
            name="chat stream",
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
                return
            done = False
            try:
                for line in response.iter_lines():
                    done = done or line == b"data: [DONE]"
            except RequestException as error:  # the stream broke off
                response.failure(error)
                return
            if done:
                response.success()
            else:
                response.failure("the stream ended before data: [DONE]")
