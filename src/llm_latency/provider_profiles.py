"""What each LLM provider's HTTP API says about an attempt: one profile per provider.

A profile lists the provider's routes (they name the spans: ``POST /v1/chat/completions``), the
response headers that carry its request id, its own measure of the server's time, its
rate-limit state, the request header that numbers an SDK's retries, and the content types of
its streams. Everything else in llm-latency reads these through the tables
:mod:`llm_latency.providers` builds from them, so adding a provider is adding one profile: in
:mod:`~llm_latency.openai_compatible_profiles` when it serves OpenAI's API, else in
:mod:`~llm_latency.native_api_profiles`, and its place in :data:`PROFILES`.

Where each name comes from is noted beside it (the provider's SDK source or its API reference);
README's "Providers" table lists the same.
"""

from __future__ import annotations

from typing import Final

from llm_latency.native_api_profiles import ANTHROPIC, BEDROCK, COHERE, GEMINI, MISTRAL, OLLAMA
from llm_latency.openai_compatible_profiles import (
    AZURE_OPENAI,
    FIREWORKS,
    GROQ,
    OPENAI,
    SELF_HOSTED,
)
from llm_latency.provider_schema import ProviderProfile

#: Known providers, in the order their routes and headers are matched (the first route that
#: matches names the span). Sources: each SDK's own source as installed from PyPI (named in
#: each profile), and the providers' API references.
PROFILES: Final[tuple[ProviderProfile, ...]] = (
    OPENAI,
    AZURE_OPENAI,
    ANTHROPIC,
    BEDROCK,
    GEMINI,
    MISTRAL,
    COHERE,
    GROQ,
    OLLAMA,
    FIREWORKS,
    SELF_HOSTED,
)
