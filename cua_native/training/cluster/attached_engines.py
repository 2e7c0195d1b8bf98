"""AReaL's remote engines for attached servers, with the trainer's collective backend.

AReaL's SGLang and vLLM clients name the backend of the NCCL ("xccl") weight-update group by
the platform *of the process that sends the request* (``current_platform``). When AReaL launches
the servers, that process is a rollout worker holding the servers' GPUs, so it says ``nccl``.
When the run attaches to running servers (``AREAL_LLM_SERVER_ADDRS``, or a rehearsal's stand-in),
the rollout workers hold no GPU; they would ask the servers for a ``gloo`` group while the trainer
(rank 0) creates an ``nccl`` one, and both sides wait for each other until the rendezvous times
out: the first weight update never starts.

The engines here start with the checked backends of ``cua_native.engine.remote`` (prompt
checks; vLLM's restart of aborted chat turns), told the trainer's backend, which
``CUAPPOTrainer`` puts in the rollout scheduling specs (``CUA_WEIGHT_UPDATE_BACKEND``). Without
the variable the group request is AReaL's.
"""

from __future__ import annotations

import os
from typing import Any

from areal.engine import RemoteSGLangEngine, RemotevLLMEngine

from cua_native.engine.remote import CheckedSGLangBackend, CheckedVLLMBackend

WEIGHT_BACKEND_ENV = "CUA_WEIGHT_UPDATE_BACKEND"
"""The ``torch.distributed`` backend the trainer uses for xccl weight updates."""


def trainer_weight_backend(actor_gpus: int) -> str:
    """The backend AReaL's FSDP actor uses for its weight-update group: ``nccl`` on GPUs
    (CUDA platforms), ``gloo`` on CPU."""
    return "nccl" if actor_gpus > 0 else "gloo"


class AttachedSGLangEngine(RemoteSGLangEngine):
    """``RemoteSGLangEngine`` with the checked backend, asking for the trainer's group backend."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._engine.backend = CheckedSGLangBackend(os.environ.get(WEIGHT_BACKEND_ENV) or None)


class AttachedVLLMEngine(RemotevLLMEngine):
    """``RemotevLLMEngine`` with the checked backend, asking for the trainer's group backend."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._engine.backend = CheckedVLLMBackend(os.environ.get(WEIGHT_BACKEND_ENV) or None)
