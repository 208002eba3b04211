"""botocore (under boto3): one logical parent per Bedrock API call.

botocore retries inside ``BaseClient._make_api_call`` (the endpoint's ``_send_request`` loop:
``_send``, then the ``needs-retry`` handlers, which sleep between attempts), in its legacy,
standard and adaptive retry modes alike. Hooking ``_make_api_call`` gives each call's attempts,
and the ``retry.backoff`` waits between them (reason: the status of the attempt that failed,
429 for a ``ThrottlingException``), one parent span named ``{service} {Operation}``
(``bedrock-runtime Converse``), with ``llm_latency.sdk`` = ``botocore``. A streamed call's span
ends when its event stream does (read to the end, or closed). The HTTP attempts themselves come
from the requests (urllib3) adapter, with ``http.request.resend_count`` from botocore's
``amz-sdk-request`` header.

Only the Bedrock data-plane services, whose calls are model inferences or the agents and
retrieval built on them, get a parent (:data:`BEDROCK_SERVICES`). Every other AWS service (S3,
DynamoDB, Bedrock's control plane ``bedrock``, ...) is left exactly as without this adapter: its
HTTP attempts are traced like any urllib3 request, and no span is added around its calls.

Beside ``opentelemetry-instrumentation-botocore``: its span around each call is the parent
(a Bedrock inference's is a GenAI span, with ``gen_ai.*`` attributes, and ``open_call`` adds none
under it), and its ``suppress_http_instrumentation()`` no longer hides the attempts beneath a
GenAI span (see ``suppression``).
"""

from __future__ import annotations

from typing import Any, Final

from llm_latency import semconv
from llm_latency.adapters._patching import SKIP, Hook, PatchSet, Unavailable
from llm_latency.calls import LogicalCall, current_call
from llm_latency.emitter import Emitter
from llm_latency.suppression import tracing_allowed

#: botocore service names (``client.meta.service_model.service_name``) whose calls get a
#: logical parent: Bedrock's runtimes, where each call runs a model.
BEDROCK_SERVICES: Final = frozenset({"bedrock-runtime", "bedrock-agent-runtime"})

#: The value of ``llm_latency.sdk`` on the parent span.
SDK_NAME: Final = "botocore"

_State = tuple[LogicalCall, Any, Any]


def _service_name(client: Any) -> str | None:
    """The botocore name of the client's service, or None for an object that is no client."""
    try:
        name = client.meta.service_model.service_name
    except AttributeError:
        return None
    return name if isinstance(name, str) else None


class BotocoreAdapter:
    """Hooks botocore's ``BaseClient._make_api_call`` for the Bedrock runtime services."""

    def __init__(self, emitter: Emitter) -> None:
        self.name = SDK_NAME
        self._emitter = emitter
        self._patches = PatchSet(SDK_NAME, emitter.failed_once)
        self.lost: list[str] = self._patches.lost

    def install(self) -> None:
        """Hook ``_make_api_call`` (aiobotocore's ``AioBaseClient`` overrides it: not hooked)."""
        hook = Hook(self._enter, self._returns, self._exit)
        if not self._patches.group(
            "one parent span per Bedrock call",
            [("botocore.client:BaseClient", "_make_api_call", hook)],
        ):
            raise Unavailable(self._patches.lost)

    def uninstall(self) -> None:
        """Undo the hook."""
        self._patches.restore()

    def _enter(self, client: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        service = _service_name(client)
        if service not in BEDROCK_SERVICES or not tracing_allowed():
            return SKIP
        operation = args[0] if args else kwargs.get("operation_name", "")
        call = self._emitter.open_call(f"{service} {operation}", {semconv.SDK: SDK_NAME})
        token = current_call.set(call)
        return call, token, self._emitter.enter_call(call)

    def _exit(self, state: _State, error: BaseException | None) -> None:
        call, token, attached = state
        self._emitter.exit_call(attached)
        current_call.reset(token)
        self._emitter.close_call(call, error)

    def _returns(self, state: _State, result: Any) -> Any:
        self._exit(state, None)
        return result
