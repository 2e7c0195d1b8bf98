"""AReaL's remote engines for attached servers, with the trainer's collective backend.

AReaL's SGLang and vLLM clients name the backend of the NCCL ("xccl") weight-update group by
the platform *of the process that sends the request* (``current_platform``). When AReaL launches
the servers, that process is a rollout worker holding the servers' GPUs, so it says ``nccl``.
When the run attaches to running servers (``AREAL_LLM_SERVER_ADDRS``, or a rehearsal's stand-in),
the rollout workers hold no GPU; they would ask the servers for a ``gloo`` group while the trainer
(rank 0) creates an ``nccl`` one, and both sides wait for each other until the rendezvous times
out: the first weight update never starts.

The engines here ask for the trainer's backend instead, named in the worker's environment
(``CUA_WEIGHT_UPDATE_BACKEND``, which ``CUAPPOTrainer`` puts in the rollout scheduling specs).
Without it they behave exactly as AReaL's.
"""

from __future__ import annotations

import os
from typing import Any

from areal.engine import RemoteSGLangEngine, RemotevLLMEngine
from areal.engine.sglang_remote import SGLangBackend
from areal.engine.vllm_remote import VLLMBackend

WEIGHT_BACKEND_ENV = "CUA_WEIGHT_UPDATE_BACKEND"
"""The ``torch.distributed`` backend the trainer uses for xccl weight updates."""


def trainer_weight_backend(actor_gpus: int) -> str:
    """The backend AReaL's FSDP actor uses for its weight-update group: ``nccl`` on GPUs
    (CUDA platforms), ``gloo`` on CPU."""
    return "nccl" if actor_gpus > 0 else "gloo"


def _with_backend(request: Any, backend: str | None) -> Any:
    if backend:
        request.payload["backend"] = backend
    return request


class TrainerBackendSGLang(SGLangBackend):
    """SGLang's request builder, naming ``backend`` (else AReaL's choice) for the group."""

    def __init__(self, backend: str | None) -> None:
        super().__init__()
        self.weight_backend = backend

    def build_init_weights_group_request(self, addr: str, server_idx: int, meta: Any) -> Any:
        request = super().build_init_weights_group_request(addr, server_idx, meta)
        return _with_backend(request, self.weight_backend)


class TrainerBackendVLLM(VLLMBackend):
    """vLLM's request builder, naming ``backend`` (else AReaL's choice) for the group."""

    def __init__(self, backend: str | None) -> None:
        super().__init__()
        self.weight_backend = backend

    def build_init_weights_group_request(self, addr: str, server_idx: int, meta: Any) -> Any:
        request = super().build_init_weights_group_request(addr, server_idx, meta)
        return _with_backend(request, self.weight_backend)


class AttachedSGLangEngine(RemoteSGLangEngine):
    """``RemoteSGLangEngine`` whose weight-update group uses the trainer's backend."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._engine.backend = TrainerBackendSGLang(os.environ.get(WEIGHT_BACKEND_ENV) or None)


class AttachedVLLMEngine(RemotevLLMEngine):
    """``RemotevLLMEngine`` whose weight-update group uses the trainer's backend."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._engine.backend = TrainerBackendVLLM(os.environ.get(WEIGHT_BACKEND_ENV) or None)
