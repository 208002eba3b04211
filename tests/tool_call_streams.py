"""Recorded tool-call streams of every format llm-latency reads, event by event, in the shapes
of each provider's SDK stream types (named beside each): for each, a turn that calls a tool
first, one that writes text and then calls a tool, and one that calls two tools at once.

Each :class:`Recording` says which of its events holds the answer's first generated token (the
tool call's opening: the event that names the tool, or the text before it) and the output
tokens its usage reports. ``tests/test_tool_calls.py`` replays them from a loopback server.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from tests.bedrock_api import event_message

SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
EVENT_STREAM = "application/vnd.amazon.eventstream"
INPUT_TOKENS = 30
OUTPUT_TOKENS = 24
WEATHER = ("get_weather", ['{"city', '": "Par', 'is"}'])
TIME = ("get_time", ['{"zone', '": "Europe/', 'Paris"}'])


@dataclass(frozen=True)
class Recording:
    """One recorded stream: its provider's route, content type and events (each as it came
    in one network read); ``first``: the index of the event with the first token."""

    name: str
    path: str
    content_type: str
    events: tuple[bytes, ...]
    first: int
    output_tokens: int = OUTPUT_TOKENS


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"))


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {_json(data)}\n\n".encode()


# -- OpenAI chat completions (openai: types/chat/chat_completion_chunk.py) ---------------------

_CHAT = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "gpt-4o"}


def _chat(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return sse({**_CHAT, "choices": [choice], "usage": None})


def _chat_call(index: int, tool: tuple[str, list[str]]) -> list[bytes]:
    """A tool call as OpenAI streams it: the opening delta names the tool with empty
    arguments, then the arguments come in pieces."""
    name, pieces = tool
    opening = {"index": index, "id": f"call_{index}", "type": "function",
               "function": {"name": name, "arguments": ""}}  # fmt: skip
    return [_chat({"tool_calls": [opening]})] + [
        _chat({"tool_calls": [{"index": index, "function": {"arguments": p}}]}) for p in pieces
    ]


def _chat_end(usage_key: str = "completion_tokens") -> list[bytes]:
    usage = {"prompt_tokens": INPUT_TOKENS, usage_key: OUTPUT_TOKENS,
             "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}  # fmt: skip
    return [
        _chat({}, "tool_calls"),
        sse({**_CHAT, "choices": [], "usage": usage}),
        b"data: [DONE]\n\n",
    ]


def openai_chat() -> list[Recording]:
    role = _chat({"role": "assistant", "content": None, "refusal": None})
    first_call = _chat_call(0, WEATHER)
    # OpenAI's first chunk of a tool-call turn carries the role with the opening delta.
    opening = _chat({"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": "call_0", "type": "function",
         "function": {"name": WEATHER[0], "arguments": ""}}]})  # fmt: skip
    text = [_chat({"role": "assistant", "content": ""}), _chat({"content": "Let me"}),
            _chat({"content": " check."})]  # fmt: skip
    path = "/v1/chat/completions"
    return [
        Recording("openai chat: tool first", path, SSE,
                  (opening, *first_call[1:], *_chat_end()), 0),
        Recording("openai chat: role, then tool", path, SSE,
                  (role, *first_call, *_chat_end()), 1),
        Recording("openai chat: text, then tool", path, SSE,
                  (*text, *first_call, *_chat_end()), 1),
        Recording("openai chat: parallel tools", path, SSE,
                  (role, *first_call, *_chat_call(1, TIME), *_chat_end()), 1),
    ]  # fmt: skip


# -- OpenAI Responses API (openai: types/responses/response_stream_event.py) --------------------


def _responses() -> list[Recording]:
    sequence = iter(range(1000))

    def event(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, "sequence_number": next(sequence), **fields}, event=kind)

    response = {"id": "resp_1", "object": "response", "status": "in_progress", "model": "gpt-4o",
                "output": [], "tool_choice": "auto", "text": {"format": {"type": "text"}},
                "tools": [{"type": "function", "name": WEATHER[0], "strict": True,
                           "parameters": {"type": "object", "properties": {
                               "city": {"type": "string"}}}}]}  # fmt: skip

    def start() -> list[bytes]:
        return [event("response.created", response=response),
                event("response.in_progress", response=response)]  # fmt: skip

    def call(index: int, tool: tuple[str, list[str]]) -> list[bytes]:
        name, pieces = tool
        item = {"id": f"fc_{index}", "type": "function_call", "status": "in_progress",
                "arguments": "", "call_id": f"call_{index}", "name": name}  # fmt: skip
        done = {**item, "status": "completed", "arguments": "".join(pieces)}
        return [
            event("response.output_item.added", output_index=index, item=item),
            *(event("response.function_call_arguments.delta", item_id=f"fc_{index}",
                    output_index=index, delta=p) for p in pieces),
            event("response.function_call_arguments.done", item_id=f"fc_{index}",
                  output_index=index, arguments=done["arguments"]),
            event("response.output_item.done", output_index=index, item=done),
        ]  # fmt: skip

    def message() -> list[bytes]:
        item = {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant",
                "content": []}  # fmt: skip
        part = {"type": "output_text", "text": "", "annotations": []}
        return [
            event("response.output_item.added", output_index=0, item=item),
            event("response.content_part.added", item_id="msg_1", output_index=0,
                  content_index=0, part=part),
            event("response.output_text.delta", item_id="msg_1", output_index=0,
                  content_index=0, delta="Let me check."),
            event("response.output_text.done", item_id="msg_1", output_index=0,
                  content_index=0, text="Let me check."),
        ]  # fmt: skip

    def end() -> list[bytes]:
        usage = {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS,
                 "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}  # fmt: skip
        return [event("response.completed", response={**response, "status": "completed",
                                                        "usage": usage})]  # fmt: skip

    path = "/v1/responses"
    return [
        Recording("responses: tool first", path, SSE, (*start(), *call(0, WEATHER), *end()), 2),
        Recording("responses: text, then tool", path, SSE,
                  (*start(), *message(), *call(1, WEATHER), *end()), 4),
        Recording("responses: parallel tools", path, SSE,
                  (*start(), *call(0, WEATHER), *call(1, TIME), *end()), 2),
    ]  # fmt: skip


# -- Anthropic messages (anthropic: types/raw_message_stream_event.py) --------------------------


def _anthropic_events(blocks: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic's events for content blocks: ``("text", [pieces])`` or ``("tool", tool)``."""
    message: dict[str, Any] = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": INPUT_TOKENS, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0, "output_tokens": 1}}  # fmt: skip
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
    for index, (kind, value) in enumerate(blocks):
        if kind == "text":
            events.append({"type": "content_block_start", "index": index,
                           "content_block": {"type": "text", "text": ""}})  # fmt: skip
            if index == 0:
                events.append({"type": "ping"})
            events += [{"type": "content_block_delta", "index": index,
                        "delta": {"type": "text_delta", "text": p}} for p in value]  # fmt: skip
        else:
            name, pieces = value
            block = {"type": "tool_use", "id": f"toolu_{index}", "name": name, "input": {}}
            events.append({"type": "content_block_start", "index": index, "content_block": block})
            if index == 0:
                events.append({"type": "ping"})
            # The first input delta is empty, as Anthropic sends it.
            events += [{"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": p}}
                       for p in ["", *pieces]]  # fmt: skip
        events.append({"type": "content_block_stop", "index": index})
    events += [
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
         "usage": {"output_tokens": OUTPUT_TOKENS}},
        {"type": "message_stop"},
    ]  # fmt: skip
    return events


_ANTHROPIC_TURNS: list[tuple[str, list[tuple[str, Any]], int]] = [
    # content_block_start names the tool (after message_start): the first token.
    ("tool first", [("tool", WEATHER)], 1),
    ("text, then tool", [("text", ["Let me", " check."]), ("tool", WEATHER)], 3),
    ("parallel tools", [("tool", WEATHER), ("tool", TIME)], 1),
]


def anthropic() -> list[Recording]:
    return [
        Recording(f"anthropic: {name}", "/v1/messages", SSE,
                  tuple(sse(e, event=e["type"]) for e in _anthropic_events(blocks)), first)
        for name, blocks, first in _ANTHROPIC_TURNS
    ]  # fmt: skip


def bedrock_invoke_anthropic() -> list[Recording]:
    """InvokeModelWithResponseStream of a Claude model: Anthropic's events, each in a
    ``chunk`` message's base64 ``bytes`` (the last also carries Bedrock's metrics)."""
    recordings = []
    for name, blocks, first in _ANTHROPIC_TURNS:
        events = _anthropic_events(blocks)
        events[-1]["amazon-bedrock-invocationMetrics"] = {
            "inputTokenCount": INPUT_TOKENS, "outputTokenCount": OUTPUT_TOKENS,
            "invocationLatency": 400, "firstByteLatency": 200}  # fmt: skip
        messages = tuple(
            event_message("chunk", {"bytes": base64.b64encode(_json(e).encode()).decode()})
            for e in events
        )
        path = "/model/anthropic.claude-sonnet-4-5/invoke-with-response-stream"
        recordings.append(Recording(f"bedrock invoke: {name}", path, EVENT_STREAM, messages, first))
    return recordings


# -- Bedrock ConverseStream (botocore: data/bedrock-runtime/2023-09-30, ConverseStreamOutput) ---


def _converse(blocks: list[tuple[str, Any]]) -> tuple[bytes, ...]:
    events = [event_message("messageStart", {"role": "assistant"})]
    for index, (kind, value) in enumerate(blocks):
        if kind == "text":
            events += [event_message("contentBlockDelta",
                                     {"contentBlockIndex": index, "delta": {"text": p}})
                       for p in value]  # fmt: skip
        else:
            name, pieces = value
            start = {"toolUse": {"toolUseId": f"tooluse_{index}", "name": name}}
            events.append(
                event_message("contentBlockStart", {"contentBlockIndex": index, "start": start})
            )
            events += [event_message("contentBlockDelta",
                                     {"contentBlockIndex": index,
                                      "delta": {"toolUse": {"input": p}}})
                       for p in pieces]  # fmt: skip
        events.append(event_message("contentBlockStop", {"contentBlockIndex": index}))
    usage = {"inputTokens": INPUT_TOKENS, "outputTokens": OUTPUT_TOKENS,
             "totalTokens": INPUT_TOKENS + OUTPUT_TOKENS}  # fmt: skip
    events += [
        event_message("messageStop", {"stopReason": "tool_use"}),
        event_message("metadata", {"usage": usage, "metrics": {"latencyMs": 400}}),
    ]
    return tuple(events)


def bedrock_converse() -> list[Recording]:
    path = "/model/anthropic.claude-sonnet-4-5/converse-stream"
    return [
        Recording(f"bedrock converse: {name}", path, EVENT_STREAM, _converse(blocks), 1)
        for name, blocks, _ in _ANTHROPIC_TURNS
    ]


# -- Gemini (google-genai: types.py GenerateContentResponse, Part.function_call) ----------------


def _gemini(parts: list[dict[str, Any]], last: bool) -> bytes:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    usage: dict[str, Any] = {"promptTokenCount": INPUT_TOKENS}
    if last:
        candidate["finishReason"] = "STOP"
        usage.update(candidatesTokenCount=OUTPUT_TOKENS,
                     totalTokenCount=INPUT_TOKENS + OUTPUT_TOKENS)  # fmt: skip
    return sse({"candidates": [candidate], "usageMetadata": usage,
                "modelVersion": "gemini-2.5-flash", "responseId": "resp_1"})  # fmt: skip


def _function_call(tool: tuple[str, list[str]]) -> dict[str, Any]:
    name, pieces = tool
    return {"functionCall": {"name": name, "args": json.loads("".join(pieces))},
            "thoughtSignature": "CiQB0e2Kb8"}  # fmt: skip


def gemini() -> list[Recording]:
    path = "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    call, other = _function_call(WEATHER), _function_call(TIME)
    return [
        # Gemini sends a function call whole, in one chunk.
        Recording("gemini: tool first", path, SSE,
                  (_gemini([call], False), _gemini([{"text": ""}], True)), 0),
        Recording("gemini: tool first, one chunk", path, SSE, (_gemini([call], True),), 0),
        Recording("gemini: text, then tool", path, SSE,
                  (_gemini([{"text": "Let me"}], False), _gemini([{"text": " check."}], False),
                   _gemini([call], True)), 0),
        Recording("gemini: parallel tools", path, SSE,
                  (_gemini([call], False), _gemini([other], True)), 0),
        Recording("gemini: parallel tools, one chunk", path, SSE,
                  (_gemini([call, other], True),), 0),
    ]  # fmt: skip


# -- Ollama /api/chat (ollama: _types.py ChatResponse, Message.tool_calls) ---------------------


def _ollama(message: dict[str, Any]) -> bytes:
    line = {"model": "llama3.2", "created_at": "2025-01-01T00:00:00.000000Z",
            "message": {"role": "assistant", "content": "", **message}, "done": False}  # fmt: skip
    return (_json(line) + "\n").encode()


def _ollama_done() -> bytes:
    line = {"model": "llama3.2", "created_at": "2025-01-01T00:00:01.000000Z",
            "message": {"role": "assistant", "content": ""}, "done": True,
            "done_reason": "stop", "total_duration": 900000000, "load_duration": 1000000,
            "prompt_eval_count": INPUT_TOKENS, "prompt_eval_duration": 200000000,
            "eval_count": OUTPUT_TOKENS, "eval_duration": 600000000}  # fmt: skip
    return (_json(line) + "\n").encode()


def _ollama_call(tool: tuple[str, list[str]], index: int) -> dict[str, Any]:
    name, pieces = tool
    return {"function": {"index": index, "name": name, "arguments": json.loads("".join(pieces))}}


def ollama() -> list[Recording]:
    call, other = _ollama_call(WEATHER, 0), _ollama_call(TIME, 1)
    return [
        # Ollama sends each tool call whole, its arguments an object.
        Recording("ollama: tool first", "/api/chat", NDJSON,
                  (_ollama({"tool_calls": [call]}), _ollama_done()), 0),
        Recording("ollama: text, then tool", "/api/chat", NDJSON,
                  (_ollama({"content": "Let me"}), _ollama({"content": " check."}),
                   _ollama({"tool_calls": [call]}), _ollama_done()), 0),
        Recording("ollama: parallel tools", "/api/chat", NDJSON,
                  (_ollama({"tool_calls": [call, other]}), _ollama_done()), 0),
    ]  # fmt: skip


# -- Cohere v2 chat (cohere: v2/types/v2chat_stream_response.py) --------------------------------


def _cohere(kind: str, **fields: Any) -> bytes:
    return sse({"type": kind, **fields}, event=kind)


def _cohere_call(index: int, tool: tuple[str, list[str]]) -> list[bytes]:
    name, pieces = tool
    start = {"id": f"call_{index}", "type": "function",
             "function": {"name": name, "arguments": ""}}  # fmt: skip
    return [
        _cohere("tool-call-start", index=index, delta={"message": {"tool_calls": start}}),
        *(_cohere("tool-call-delta", index=index,
                  delta={"message": {"tool_calls": {"function": {"arguments": p}}}})
          for p in pieces),
        _cohere("tool-call-end", index=index),
    ]  # fmt: skip


def cohere() -> list[Recording]:
    begin = _cohere("message-start", id="c-1", delta={"message": {"role": "assistant"}})
    plan = [_cohere("tool-plan-delta", delta={"message": {"tool_plan": p}})
            for p in ["I will", " check the weather."]]  # fmt: skip
    usage = {"billed_units": {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS},
             "tokens": {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS}}  # fmt: skip
    end = _cohere("message-end", delta={"finish_reason": "TOOL_CALL", "usage": usage})
    return [
        Recording("cohere: tool first", "/v2/chat", SSE,
                  (begin, *_cohere_call(0, WEATHER), end), 1),
        Recording("cohere: tool plan, then tool", "/v2/chat", SSE,
                  (begin, *plan, *_cohere_call(0, WEATHER), end), 1),
        Recording("cohere: parallel tools", "/v2/chat", SSE,
                  (begin, *_cohere_call(0, WEATHER), *_cohere_call(1, TIME), end), 1),
    ]  # fmt: skip


# -- Mistral chat (mistralai: client/models/deltamessage.py, toolcall.py) ----------------------


def _mistral(delta: dict[str, Any], finish: str | None = None, usage: bool = False) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    chunk: dict[str, Any] = {"id": "cmpl-1", "object": "chat.completion.chunk", "created": 0,
                             "model": "mistral-large-latest", "choices": [choice]}  # fmt: skip
    if usage:
        chunk["usage"] = {"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS,
                          "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}  # fmt: skip
    return sse(chunk)


def mistral() -> list[Recording]:
    def call(index: int, tool: tuple[str, list[str]]) -> dict[str, Any]:
        name, pieces = tool
        # Mistral sends a tool call whole; its arguments may be an object (FunctionCall).
        return {"id": f"call{index}", "type": "function", "index": index,
                "function": {"name": name, "arguments": json.loads("".join(pieces))}}  # fmt: skip

    role = _mistral({"role": "assistant", "content": ""})
    done = b"data: [DONE]\n\n"
    path = "/v1/chat/completions"
    return [
        Recording("mistral: tool first", path, SSE,
                  (role, _mistral({"tool_calls": [call(0, WEATHER)]}),
                   _mistral({"content": ""}, "tool_calls", usage=True), done), 1),
        Recording("mistral: text, then tool", path, SSE,
                  (role, _mistral({"content": "Let me"}), _mistral({"content": " check."}),
                   _mistral({"tool_calls": [call(0, WEATHER)]}),
                   _mistral({"content": ""}, "tool_calls", usage=True), done), 1),
        Recording("mistral: parallel tools", path, SSE,
                  (role, _mistral({"tool_calls": [call(0, WEATHER), call(1, TIME)]}),
                   _mistral({"content": ""}, "tool_calls", usage=True), done), 1),
    ]  # fmt: skip


RECORDINGS: tuple[Recording, ...] = (
    *openai_chat(),
    *_responses(),
    *anthropic(),
    *bedrock_invoke_anthropic(),
    *bedrock_converse(),
    *gemini(),
    *ollama(),
    *cohere(),
    *mistral(),
)
