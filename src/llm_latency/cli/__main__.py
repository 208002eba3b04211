"""``python -m llm_latency.cli``."""

from llm_latency.cli import main

main()
