"""Load-test an OpenAI-compatible endpoint with Locust, every request traced by llm-latency.

    llm-latency mock-server --port 8000 --ttfb 0.3 --rate-limit-every 20 &
    OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 OTEL_SERVICE_NAME=locust \\
        locust -f examples/locustfile.py --host http://127.0.0.1:8000 --headless -u 20 -r 5 -t 1m

Locust's ``HttpUser`` runs on requests (urllib3), which llm-latency instruments: each request
is a span with its phases, and the metrics (``llm_latency_phase_duration_seconds``,
``llm_latency_rate_limited_total``, ...) reach the deploy bundle's Prometheus.
"""

from locust import HttpUser, between, task

import llm_latency

llm_latency.instrument(clients=["requests"])

BODY = {"model": "mock-gpt", "messages": [{"role": "user", "content": "Say hello."}]}


class ChatUser(HttpUser):
    """Sends chat completions, half of them streamed."""

    wait_time = between(0.5, 1.5)

    @task
    def complete(self) -> None:
        self.client.post("/v1/chat/completions", json=BODY, name="chat")

    @task
    def stream(self) -> None:
        with self.client.post(
            "/v1/chat/completions", json={**BODY, "stream": True}, stream=True, name="chat stream"
        ) as response:
            for _ in response.iter_lines():
                pass
