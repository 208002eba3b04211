"""A program that calls ``instrument()`` (the SDK set up from ``OTEL_*``), makes two chat
completions with the openai SDK, and prints one line of its own.

    python tests/programs/openai_calls.py BASE_URL
"""

from __future__ import annotations

import sys

import openai

import llm_latency


def main(base_url: str) -> None:
    llm_latency.instrument()
    client = openai.OpenAI(base_url=base_url, api_key="sk-never-printed-5150")
    for _ in range(2):
        client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "hi"}]
        )
    print("the program's own output")


if __name__ == "__main__":
    main(sys.argv[1])
