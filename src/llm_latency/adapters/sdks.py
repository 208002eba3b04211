"""LLM SDKs: one logical parent per SDK call.

Each SDK retries inside one call, in one method of its own: openai's, anthropic's and groq's
``SyncAPIClient.request``, google-genai's ``BaseApiClient._request`` (a tenacity loop),
mistralai's ``BaseSDK.do_request`` (its ``RetryConfig`` loop), cohere's ``HttpClient.request``
(which calls itself for each retry). Hooking that method gives the call's attempts, and the
``retry.backoff`` waits between them, one parent span named ``{sdk} {METHOD} {path}``, even when
the program has no span of its own; when a GenAI span (from
``opentelemetry-instrumentation-openai-v2`` or ``-google-genai``, say) is already current, it is
the parent instead. The HTTP attempts themselves come from the httpx, httpx2 or aiohttp adapter.

botocore (under boto3) retries inside ``BaseClient._make_api_call`` in its legacy, standard and
adaptive modes alike; its calls are named ``{service} {Operation}`` (``bedrock-runtime
Converse``), and only those of the Bedrock runtimes, where each call runs a model, get a parent
(:data:`BEDROCK_SERVICES`): every other AWS service (S3, DynamoDB, Bedrock's control plane) is
left as without this adapter, its HTTP attempts traced like any urllib3 request. Beside
``opentelemetry-instrumentation-botocore``, its GenAI span around a Bedrock inference is the
parent, and its ``suppress_http_instrumentation()`` does not hide the attempts beneath a GenAI
span (see ``suppression``).

An SDK is one :class:`SdkCalls` declaration: where its retry loop is (sync and async, one
:class:`Layout` per module layout it has had), and how to name the call from that method's
arguments (or to leave it alone). A method that returns a context manager which sends the
request when entered (cohere's ``HttpClient.stream``) is declared as a stream: the call opens
around the entering.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from llm_latency import semconv
from llm_latency.adapters._hooks import SKIP, Hook
from llm_latency.adapters._patching import PatchSet, Unavailable, module_installed
from llm_latency.calls import LogicalCall, current_call
from llm_latency.emitter import Emitter
from llm_latency.suppression import tracing_allowed
from llm_latency.urls import route_template

#: ``(METHOD, path)`` of the call, from the hooked method's arguments (without ``self``).
Describe = Callable[[tuple[Any, ...], dict[str, Any]], tuple[str, str]]
#: The call's span name from the SDK's name, the hooked method's ``self`` and arguments; None
#: leaves the call alone (no parent span).
Name = Callable[[str, Any, tuple[Any, ...], dict[str, Any]], "str | None"]

#: botocore service names whose calls get a logical parent: Bedrock's runtimes.
BEDROCK_SERVICES: Final = frozenset({"bedrock-runtime", "bedrock-agent-runtime"})

_State = tuple[LogicalCall, Any, Any, Any]

#: The SDK whose call is running in this task or thread: its own methods called inside it
#: (cohere's request calls itself for each retry) belong to that call.
_inside: ContextVar[str | None] = ContextVar("llm_latency_sdk_call", default=None)


@dataclass(frozen=True)
class Layout:
    """One version of an SDK's module layout: ``"module:Class.method"`` names."""

    #: Methods holding one call's retry loop (sync and async).
    calls: tuple[str, ...]
    #: Methods returning a context manager that sends a streamed request when entered.
    streams: tuple[str, ...] = ()

    def modules(self) -> set[str]:
        return {name.partition(":")[0] for name in (*self.calls, *self.streams)}


@dataclass(frozen=True)
class SdkCalls:
    """Where one SDK runs a call's retries, and how its call span is named."""

    sdk: str
    #: Newest first: the first whose modules exist is hooked.
    layouts: tuple[Layout, ...]
    name: Name


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def _stainless(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str]:
    """openai, anthropic, groq: ``request(cast_to, options, ...)``; ``options.url`` is the
    path under the client's base URL."""
    options = _arg(args, kwargs, 1, "options")
    return str(getattr(options, "method", "")), str(getattr(options, "url", ""))


def _genai(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str]:
    """google-genai: ``_request(http_request, ...)`` with the full URL; the model (and, on
    Vertex AI, the project) in the path become placeholders."""
    request = _arg(args, kwargs, 0, "http_request")
    path = urlsplit(str(getattr(request, "url", ""))).path
    return str(getattr(request, "method", "")), route_template(path) or path


def _mistral(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str]:
    """mistralai: ``do_request(hook_ctx, request, ...)`` with the built ``httpx.Request``."""
    request = _arg(args, kwargs, 1, "request")
    url = getattr(request, "url", None)
    return str(getattr(request, "method", "")), str(getattr(url, "path", ""))


def _cohere(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str]:
    """cohere: ``request(path, *, method, ...)`` with the path relative to the base URL."""
    path = str(_arg(args, kwargs, 0, "path") or "")
    return str(kwargs.get("method", "")), "/" + path.lstrip("/")


#: A path segment that is an API version (``v1``, ``v1beta``, ``v2alpha1``).
_VERSION = re.compile(r"v\d+(?:alpha|beta)?\d*")


def resource(path: str) -> str:
    """The API resource a path names, as the SDK's own attribute path reads it:
    ``/v1/chat/completions`` -> ``chat.completions``, ``/v1beta/models/{model}:generateContent``
    -> ``models.generateContent``; what comes before the last version segment (Groq's
    ``/openai``), placeholders and ids (any word with a digit: ``resp_68a1``, ``gpt-4o``) go,
    so that names stay few. Not the HTTP route, so that a call's span is not
    mistaken for its attempts' (``POST /v1/chat/completions``)."""
    segments = path.split("?", 1)[0].split("/")
    versions = [i for i, segment in enumerate(segments) if _VERSION.fullmatch(segment)]
    if versions:
        segments = segments[versions[-1] + 1 :]
    words = []
    for segment in segments:
        for part in segment.split(":"):
            if part and not part.startswith("{") and not any(c.isdigit() for c in part):
                words.append(part)
    return ".".join(words)


def _http_call(describe: Describe) -> Name:
    """Names a call ``{sdk} {resource}`` (:func:`resource`), and ``{sdk} {METHOD} {path}``
    when the path names none."""

    def name(sdk: str, _client: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        method, path = describe(args, kwargs)
        return f"{sdk} {resource(path) or f'{method.upper()} {path}'}".strip()

    return name


def _bedrock_call(
    _sdk: str, client: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> str | None:
    """botocore: ``_make_api_call(operation_name, api_params)``; ``{service} {Operation}`` for
    the Bedrock runtimes, None for every other service."""
    try:
        service = client.meta.service_model.service_name
    except AttributeError:
        return None
    if service not in BEDROCK_SERVICES:
        return None
    return f"{service} {_arg(args, kwargs, 0, 'operation_name')}"


def _stainless_layout(package: str) -> tuple[Layout, ...]:
    base = f"{package}._base_client"
    return (Layout((f"{base}:SyncAPIClient.request", f"{base}:AsyncAPIClient.request")),)


#: Every SDK llm-latency groups calls for, by the name its spans carry.
SDK_CALLS: dict[str, SdkCalls] = {
    "openai": SdkCalls("openai", _stainless_layout("openai"), _http_call(_stainless)),
    "anthropic": SdkCalls("anthropic", _stainless_layout("anthropic"), _http_call(_stainless)),
    "groq": SdkCalls("groq", _stainless_layout("groq"), _http_call(_stainless)),
    "google-genai": SdkCalls(
        "google-genai",
        (
            Layout(
                (
                    "google.genai._api_client:BaseApiClient._request",
                    "google.genai._api_client:BaseApiClient._async_request",
                )
            ),
        ),
        _http_call(_genai),
    ),
    "mistralai": SdkCalls(
        "mistralai",
        (
            # 2.x and later
            Layout(
                (
                    "mistralai.client.basesdk:BaseSDK.do_request",
                    "mistralai.client.basesdk:BaseSDK.do_request_async",
                )
            ),
            # 1.x
            Layout(
                (
                    "mistralai.basesdk:BaseSDK.do_request",
                    "mistralai.basesdk:BaseSDK.do_request_async",
                )
            ),
        ),
        _http_call(_mistral),
    ),
    "cohere": SdkCalls(
        "cohere",
        (
            Layout(
                (
                    "cohere.core.http_client:HttpClient.request",
                    "cohere.core.http_client:AsyncHttpClient.request",
                ),
                (
                    "cohere.core.http_client:HttpClient.stream",
                    "cohere.core.http_client:AsyncHttpClient.stream",
                ),
            ),
        ),
        _http_call(_cohere),
    ),
    "botocore": SdkCalls(
        "botocore", (Layout(("botocore.client:BaseClient._make_api_call",)),), _bedrock_call
    ),
}


def _target(name: str, hook: Hook) -> tuple[str, str, Hook]:
    owner, _, method = name.rpartition(".")
    return owner, method, hook


class SdkAdapter:
    """Hooks one SDK's call methods (see :data:`SDK_CALLS`); ``sdk`` names it there."""

    def __init__(self, emitter: Emitter, sdk: str) -> None:
        self.name = sdk
        self._calls = SDK_CALLS[sdk]
        self._emitter = emitter
        self._spans = emitter.calls
        self._patches = PatchSet(sdk, emitter.failed_once)
        self.lost: list[str] = self._patches.lost

    def install(self) -> None:
        """Hook the methods of the first layout this version of the SDK has."""
        layouts = self._calls.layouts
        layout = next(
            (lo for lo in layouts if all(map(module_installed, lo.modules()))), layouts[0]
        )
        call = Hook(self._enter, self._returns, self._exit)
        stream = Hook(self._describe, self._stream_returned)
        targets = [_target(name, call) for name in layout.calls]
        targets += [_target(name, stream) for name in layout.streams]
        capability = "one parent span per SDK call"
        if not self._patches.group(capability, targets):
            raise Unavailable(self._patches.lost)
        # The other layouts' methods are asked for too, by other versions (docs/patching.md).
        self._patches.targets.extend(
            (capability, name.replace(":", "."))
            for other in layouts
            if other is not layout
            for name in (*other.calls, *other.streams)
        )

    def uninstall(self) -> None:
        """Undo the hooks."""
        self._patches.restore()

    def _describe(self, _client: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if _inside.get() == self.name or not tracing_allowed():
            return SKIP
        name = self._calls.name(self.name, _client, args, kwargs)
        return SKIP if name is None else name

    def open(self, name: str) -> _State:
        """Open the call named ``name`` and make it current; :meth:`close` ends it."""
        call = self._spans.open_call(name, {semconv.SDK: self.name}, numbers_attempts=True)
        return call, current_call.set(call), _inside.set(self.name), self._spans.enter_call(call)

    def close(self, state: _State, error: BaseException | None) -> None:
        """The SDK method returned (or raised): the call ends now, or with its stream."""
        call, token, inside, attached = state
        self._spans.exit_call(attached)
        _inside.reset(inside)
        current_call.reset(token)
        # An SDK may return its last, failed response and raise only above this method.
        self._spans.close_call(call, error, returned_failure=True)

    def _enter(self, client: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        name = self._describe(client, args, kwargs)
        return name if name is SKIP else self.open(name)

    def _exit(self, state: _State, error: BaseException | None) -> None:
        self.close(state, error)

    def _returns(self, state: _State, result: Any) -> Any:
        self.close(state, None)
        return result

    def _stream_returned(self, name: str, manager: Any) -> Any:
        return _CallOnEnter(manager, self, name)


class _CallOnEnter:
    """The context manager an SDK's stream method returned: the request goes out when it is
    entered, so the call opens and returns around that (its span ends with the stream)."""

    __slots__ = ("_adapter", "_inner", "_name")

    def __init__(self, inner: Any, adapter: SdkAdapter, name: str) -> None:
        self._inner = inner
        self._adapter = adapter
        self._name = name

    def _open(self) -> _State | None:
        try:
            return self._adapter.open(self._name)
        except Exception:
            self._adapter._emitter.failed_once(f"{self._adapter.name} stream call")
            return None

    def _close(self, state: _State | None, error: BaseException | None) -> None:
        if state is None:
            return
        try:
            self._adapter.close(state, error)
        except Exception:
            self._adapter._emitter.failed_once(f"{self._adapter.name} stream call")

    def __enter__(self) -> Any:
        state = self._open()
        try:
            value = self._inner.__enter__()
        except BaseException as exc:
            self._close(state, exc)
            raise
        self._close(state, None)
        return value

    def __exit__(self, *exc_info: Any) -> Any:
        return self._inner.__exit__(*exc_info)

    async def __aenter__(self) -> Any:
        state = self._open()
        try:
            value = await self._inner.__aenter__()
        except BaseException as exc:
            self._close(state, exc)
            raise
        self._close(state, None)
        return value

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self._inner.__aexit__(*exc_info)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
