"""AReaL 1.0.4's remote engine clients, made fit for CUA turns (docs/contracts.md#vllm-chat-abort,
docs/contracts.md#server-prompt-check).

``prepare_remote_engine(engine)`` swaps the backend of an AReaL ``RemoteInfEngine`` (what a
workflow's ``arun_episode`` receives in a rollout worker; ``RemoteSGLangEngine`` and
``RemotevLLMEngine`` wrap one as ``_engine``) for a subclass of AReaL's own backend that

- reports each call's prompt to the turn's ``PromptReport`` (``cua_native.engine.prompt_report``).
  What is compared, per backend: on SGLang the **count** only (``meta_info.prompt_tokens``;
  SGLang's ``/generate`` returns no prompt ids); on vLLM the **ids** (``prompt_token_ids``,
  asked for with ``return_token_ids``, vLLM >= 0.10.2) and the count (``usage.prompt_tokens``),
  the count alone on older servers, which ignore the field;
- on SGLang, sends a vision turn with one image pad per image, which SGLang's multimodal
  processor expands into exactly the builder's ids (``cua_native.engine.sglang_vision``: ids
  sent expanded fail there), and restarts a turn that a pause aborted instead of continuing it
  from ``prompt + partial``, which the server would decode and re-tokenize;
- on vLLM, restarts a chat (vision) turn that a pause aborted instead of concatenating the
  partial and a fresh answer (``RestartingVLLMBackend``);
- given ``weight_backend``, asks the servers for that collective backend in the xccl weight-update
  group request (AReaL names the sending process's own, wrong for rollout workers without GPUs:
  ``cua_native.training.cluster.attached_engines``).

Requests, responses and everything else stay AReaL's. Idempotent and cheap (two attribute
reads once the backend is in place); any other engine is left untouched.
"""

from __future__ import annotations

from typing import Any

from areal.api.io_struct import HttpGenerationResult, HttpRequest, ModelRequest
from areal.engine.sglang_remote import SGLangBackend
from areal.engine.vllm_remote import VLLMBackend

from cua_native.engine.prompt_report import current_report
from cua_native.engine.sglang_vision import sglang_vision_ids
from cua_native.engine.versions import PinnedVersions
from cua_native.engine.vllm_restart import RestartingVLLMBackend


def _note_sent(req: ModelRequest) -> None:
    report = current_report()
    if report is not None:
        report.sent(req.input_ids)


def _note_received(result: HttpGenerationResult, count: Any, ids: Any) -> None:
    report = current_report()
    if report is None:
        return
    report.received(
        int(count) if isinstance(count, int) else None,
        [int(t) for t in ids] if isinstance(ids, list) else None,
        empty_abort=result.stop_reason == "abort" and not result.output_tokens,
    )


class _NamedWeightGroup:
    """Mixin for AReaL's backends: the xccl group request names ``weight_backend`` (when given)
    instead of the sending process's own collective backend."""

    def __init__(self, weight_backend: str | None = None) -> None:
        super().__init__()
        self.weight_backend = weight_backend

    def build_init_weights_group_request(
        self, addr: str, server_idx: int, meta: Any
    ) -> HttpRequest:
        request: HttpRequest = super().build_init_weights_group_request(  # type: ignore[misc]
            addr, server_idx, meta
        )
        if self.weight_backend:
            request.payload["backend"] = self.weight_backend
        return request


class RestartingSGLangBackend(SGLangBackend):
    """AReaL's SGLang backend that sends vision turns with one pad per image and restarts, never
    continues, a turn that a pause aborted.

    AReaL's loop appends an aborted answer's tokens to ``input_ids`` and resubmits. With images,
    SGLang decodes and re-tokenizes those ids, and a partial whose sampled split is not the
    tokenizer's own comes back as other ids, which would be trained on as if the server had
    generated from them. An abort is therefore answered as "aborted before any token" (AReaL's
    own empty-abort case): the loop keeps nothing of the partial and re-sends the original
    request, answered entirely under the weights of the resubmission, as on vLLM
    (``RestartingVLLMBackend``). Every CUA turn carries a screenshot, so this holds for text-only
    requests too (they would continue exactly; restarting them costs only time)."""

    def build_generation_request(
        self, req: ModelRequest, with_lora: bool, version: int
    ) -> HttpRequest:
        http: HttpRequest = super().build_generation_request(req, with_lora, version)
        http.payload["input_ids"] = sglang_vision_ids(req)
        return http

    def parse_generation_response(self, response: dict[str, Any]) -> HttpGenerationResult:
        result: HttpGenerationResult = super().parse_generation_response(response)
        if result.stop_reason == "abort" and result.output_tokens:
            return HttpGenerationResult(output_tokens=[], output_logprobs=[], stop_reason="abort")
        return result


class CheckedSGLangBackend(PinnedVersions, _NamedWeightGroup, RestartingSGLangBackend):
    """``RestartingSGLangBackend`` that reports the server's prompt token count and pins each
    token's weight version."""

    def build_generation_request(
        self, req: ModelRequest, with_lora: bool, version: int
    ) -> HttpRequest:
        _note_sent(req)
        return super().build_generation_request(req, with_lora, version)

    def parse_generation_response(self, response: dict[str, Any]) -> HttpGenerationResult:
        result = super().parse_generation_response(response)
        meta = response.get("meta_info") or {}
        _note_received(result, meta.get("prompt_tokens"), None)
        return result


class CheckedVLLMBackend(PinnedVersions, _NamedWeightGroup, RestartingVLLMBackend):
    """AReaL's vLLM backend that restarts aborted chat turns and reports the server's prompt
    (count and ids)."""

    def build_generation_request(
        self, req: ModelRequest, with_lora: bool, version: int
    ) -> HttpRequest:
        _note_sent(req)
        http = super().build_generation_request(req, with_lora, version)
        http.payload["return_token_ids"] = True
        return http

    def parse_generation_response(self, response: dict[str, Any]) -> HttpGenerationResult:
        result = super().parse_generation_response(response)
        choice = (response.get("choices") or [{}])[0]
        # chat answers carry the prompt ids at the top, completions inside the choice
        ids = response.get("prompt_token_ids", choice.get("prompt_token_ids"))
        _note_received(result, (response.get("usage") or {}).get("prompt_tokens"), ids)
        return result


CHECKED_BACKENDS: dict[type, type] = {
    SGLangBackend: CheckedSGLangBackend,
    RestartingSGLangBackend: CheckedSGLangBackend,
    VLLMBackend: CheckedVLLMBackend,
    RestartingVLLMBackend: CheckedVLLMBackend,
}


def prepare_remote_engine(engine: Any) -> bool:
    """Install the checked backend on an AReaL remote engine; True if ``engine`` is one (now
    or already prepared), False for any other engine (left untouched)."""
    inner = getattr(engine, "_engine", engine)  # Remote{SGLang,vLLM}Engine wrap a RemoteInfEngine
    backend = getattr(inner, "backend", None)
    if isinstance(backend, CheckedSGLangBackend | CheckedVLLMBackend):
        return True
    checked = CHECKED_BACKENDS.get(type(backend))
    if checked is None:
        return False
    inner.backend = checked()
    return True
