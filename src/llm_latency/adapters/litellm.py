"""litellm: one logical parent per ``litellm.completion`` / ``litellm.acompletion`` call.

litellm retries at two levels. ``num_retries`` is first handed down to the openai SDK as its
``max_retries`` (the SDK's own loop, with its waits); when the SDK's last attempt still fails,
litellm's ``client`` decorator retries the whole call again (``completion_with_retries``, on
tenacity, each try with ``max_retries=0``). Every one of those HTTP attempts belongs to the one
call the program made, so they all go under one span, ``litellm completion`` (or ``litellm
acompletion``), with a ``retry.backoff`` span for each wait between a failed attempt and the
next, whichever level waited.

How the levels fold into one call:

- The span carries ``gen_ai.operation.name`` and ``gen_ai.request.model``: it is the GenAI
  operation span of the call. The openai SDK's own grouping (:mod:`llm_latency.adapters.sdks`)
  sees a current GenAI span and adds no second parent span.
- The SDK builds each attempt's request in ``BaseClient._build_request``, inside its own
  grouping: there, while a litellm call runs, the attempt is made the litellm call's
  (``current_call``), so a wait across litellm's outer retries is a ``retry.backoff`` like one
  inside the SDK. (The SDK grouping's own reset of ``current_call`` when its request returns
  undoes this, as the litellm call's reset does without it.)
- ``litellm.main.completion``, which litellm's retries (and ``acompletion``) call again for each
  try, is hooked too: a try inside a running litellm call numbers its attempts after those
  already made (``http.request.resend_count``) instead of opening a call of its own.

Providers litellm reaches with its own httpx handler (Anthropic, Ollama, ...) need only the
first: their attempts come from the httpx adapter, already under the litellm call.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from llm_latency import semconv
from llm_latency.adapters._hooks import SKIP, Hook
from llm_latency.adapters._patching import PatchSet, Unavailable
from llm_latency.calls import LogicalCall, current_call
from llm_latency.emitter import Emitter
from llm_latency.suppression import tracing_allowed

#: The litellm call running in this task or thread, if any.
_running: ContextVar[LogicalCall | None] = ContextVar("llm_latency_litellm_call", default=None)

_State = tuple[LogicalCall, Any, Any, Any]


class LiteLLMAdapter:
    """Hooks litellm's ``completion`` and ``acompletion``, and the openai SDK calls they make."""

    name = "litellm"

    def __init__(self, emitter: Emitter) -> None:
        self._spans = emitter.calls
        self._patches = PatchSet("litellm", emitter.failed_once)
        self.lost: list[str] = self._patches.lost

    def install(self) -> None:
        """Hook the public functions (essential), then the inner tries and the SDK calls."""
        if not self._patches.group(
            "one parent span per litellm call",
            [
                ("litellm", "completion", self._call_hook("completion")),
                ("litellm", "acompletion", self._call_hook("acompletion")),
            ],
        ):
            raise Unavailable(self._patches.lost)
        self._patches.group(
            "resend counts across litellm's own retries",
            [
                ("litellm.main", "completion", self._call_hook("completion")),
                ("litellm.main", "acompletion", self._call_hook("acompletion")),
            ],
        )
        self._patches.group(
            "openai SDK attempts in the litellm call",
            [("openai._base_client:BaseClient", "_build_request", Hook(self._sdk_attempt))],
        )

    def uninstall(self) -> None:
        """Undo the hooks."""
        self._patches.restore()

    # -- the litellm call ---------------------------------------------------------------------

    def _call_hook(self, function: str) -> Hook:
        def enter(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return self._enter(function, args, kwargs)

        return Hook(enter, self._returns, self._exit)

    def _enter(self, function: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        running = _running.get()
        if running is not None:
            # Another try of the running call (litellm's retries call completion again): its
            # first attempt is a resend of the call's earlier ones.
            running.number_next(running.attempts)
            return SKIP
        if not tracing_allowed():
            return SKIP
        model = args[0] if args else kwargs.get("model")
        attributes: dict[str, Any] = {semconv.SDK: "litellm", semconv.GEN_AI_OPERATION_NAME: "chat"}
        if isinstance(model, str):
            attributes[semconv.GEN_AI_REQUEST_MODEL] = model
        call = self._spans.open_call(f"litellm {function}", attributes)
        return call, _running.set(call), current_call.set(call), self._spans.enter_call(call)

    def _exit(self, state: _State, error: BaseException | None) -> None:
        call, running, token, attached = state
        self._spans.exit_call(attached)
        current_call.reset(token)
        _running.reset(running)
        self._spans.close_call(call, error)

    def _returns(self, state: _State, result: Any) -> Any:
        self._exit(state, None)
        return result

    # -- the openai SDK's attempts inside it ----------------------------------------------------

    @staticmethod
    def _sdk_attempt(_client: Any, _args: tuple[Any, ...], _kwargs: dict[str, Any]) -> Any:
        call = _running.get()
        if call is not None and current_call.get() is not call:
            current_call.set(call)
        return SKIP
