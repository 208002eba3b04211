"""Small programs instrumented by llm-latency, run as processes of their own by the tests."""
