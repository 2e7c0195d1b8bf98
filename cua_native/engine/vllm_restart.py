"""Restart, never concatenate, a vLLM vision turn that a weight update aborted.

Why: docs/contracts.md#vllm-chat-abort.

What AReaL 1.0.4 does (``RemoteInfEngine.agenerate`` with ``VLLMBackend``): a request whose
``vision_msg_vllm`` is set goes to ``/v1/chat/completions`` with the original messages. When a
pause aborts it, vLLM answers ``finish_reason: "abort"`` with the partial output; the client
appends the partial to its accumulated output and to ``req.input_ids``, lowers
``max_new_tokens`` by its length and loops, but the chat path rebuilds the payload from the
unchanged messages. The server therefore generates a fresh answer from the start, and the turn
becomes partial + fresh answer (``<thinking>…<thinking>…``), which parses and is trained on.

A continuation cannot be made exact over the chat API (the partial would have to go back as
text and be re-tokenized, which does not reproduce its ids in general), so the turn is
restarted instead: ``RestartingVLLMBackend`` answers
an aborted chat response as "aborted before any token" (AReaL's own empty-abort case), so
AReaL's loop keeps nothing of the partial, leaves ``input_ids`` and ``max_new_tokens`` as they
were and re-sends the original messages, whose answer is generated entirely under the new
weights. The text path (``/v1/completions`` with token ids) continues exactly and is left as it
is. ``restart_chat_on_abort(engine)`` installs the backend on an AReaL remote vLLM engine (the
``RemotevLLMEngine`` or the ``RemoteInfEngine`` a workflow's ``arun_episode`` receives). The
cluster workflow installs ``cua_native.engine.remote.CheckedVLLMBackend``, this backend plus the
prompt check.
"""

from __future__ import annotations

from typing import Any

from areal.api.io_struct import HttpGenerationResult
from areal.engine.vllm_remote import VLLMBackend

CHAT_OBJECT = "chat.completion"


class RestartingVLLMBackend(VLLMBackend):
    """AReaL's vLLM backend, except that an aborted chat answer keeps no partial output."""

    def parse_generation_response(self, response: dict[str, Any]) -> HttpGenerationResult:
        choice = response["choices"][0]
        if response.get("object") == CHAT_OBJECT and choice.get("finish_reason") == "abort":
            return HttpGenerationResult(output_tokens=[], output_logprobs=[], stop_reason="abort")
        return super().parse_generation_response(response)


def restart_chat_on_abort(engine: Any) -> bool:
    """Make ``engine`` restart aborted chat turns; True if it is an AReaL remote vLLM engine
    (idempotent), False for any other engine (left untouched)."""
    inner = getattr(engine, "_engine", engine)  # RemotevLLMEngine wraps a RemoteInfEngine
    backend = getattr(inner, "backend", None)
    if isinstance(backend, RestartingVLLMBackend):
        return True
    if type(backend) is not VLLMBackend:
        return False
    inner.backend = RestartingVLLMBackend()
    return True
