"""aiohttp: no credential, cookie, secret query value or body ever reaches a span or metric."""

from __future__ import annotations

import aiohttp

from tests.attributes import str_attr
from tests.conftest import Telemetry
from tests.servers import SECRET_RESPONSE_BODY, LLMServer

SECRETS = {
    "authorization": "sk-authorization-secret-1111",
    "api-key": "api-key-secret-2222",
    "x-api-key": "x-api-key-secret-3333",
    "cookie": "cookie-secret-4444",
    "password": "url-password-secret-5555",
    "query": "query-secret-6666",
    "body": "request-body-secret-7777",
}


def exported_text(telemetry: Telemetry) -> str:
    spans = "\n".join(span.to_json() for span in telemetry.spans())
    data = telemetry.reader.get_metrics_data()
    return spans + (data.to_json() if data is not None else "")


async def test_no_secret_is_exported(telemetry: Telemetry, server: LLMServer) -> None:
    headers = {
        "Authorization": f"Bearer {SECRETS['authorization']}",
        "api-key": SECRETS["api-key"],
        "x-api-key": SECRETS["x-api-key"],
        "Cookie": f"session={SECRETS['cookie']}",
    }
    query = f"key={SECRETS['query']}&api_key={SECRETS['query']}&token={SECRETS['query']}"
    url = f"http://user:{SECRETS['password']}@127.0.0.1:{server.port}/v1/chat/completions?"
    plain_url = f"http://127.0.0.1:{server.port}/v1/chat/completions?"
    async with aiohttp.ClientSession() as session:
        # aiohttp refuses an Authorization header together with URL credentials: one each.
        for base, extra, sent in ((url, "", {k: v for k, v in headers.items() if k != "Authorization"}),
                                  (plain_url, "&chunks=3&sse=1", headers)):  # fmt: skip
            async with session.post(
                base + query + f"&sig={SECRETS['query']}" + extra,
                headers=sent,
                json={"messages": [{"role": "user", "content": SECRETS["body"]}]},
            ) as response:
                assert SECRET_RESPONSE_BODY.encode() in await response.read() or extra
    assert len(telemetry.requests()) == 2
    text = exported_text(telemetry)
    for secret in (*SECRETS.values(), SECRET_RESPONSE_BODY, "cookie-secret-9c1d"):
        assert secret not in text
    # The redacted URL is still useful: host, path and the names of the parameters remain.
    url_full = str_attr(telemetry.requests()[0], "url.full")
    # aiohttp moves URL credentials into an Authorization header before the request is sent
    assert url_full.startswith(f"http://127.0.0.1:{server.port}/")
    assert "key=REDACTED" in url_full and "/v1/chat/completions" in url_full
