"""A stand-in inference server for rehearsals and tests: the in-process engine behind SGLang's
or vLLM's HTTP API, as AReaL 1.0.4's remote engine clients call them.

    python -m cua_native.engine.serve --model PATH --backend sglang|vllm
        [--host 127.0.0.1] [--port N] [--device cpu|cuda] [--dtype float32|bfloat16|float16]

It exists so that the cluster path (AReaL's ``PPOTrainer`` with ``RemoteSGLangEngine`` or
``RemotevLLMEngine``) can be rehearsed on a laptop or in CI, and so that tests can hold those
clients to the contracts the real servers keep. **Production runs SGLang or vLLM**; this server
is neither fast nor complete (one sample per request, no streaming, no LoRA, no prefix cache).
What it does keep exactly: prompt ids and vision inputs built the way the real servers build
them, token logprobs under the engine's definition (``cua_native.engine.sampling``), and the
abort semantics of a pause (``core.py``) that AReaL's interruptible rollout depends on.

Abort and resubmission (docs/contracts.md#vllm-chat-abort):

* **SGLang**: a pause or a weight update aborts running requests; each answers
  ``finish_reason.type == "abort"`` with its partial tokens and logprobs, and AReaL's client
  resubmits ``input_ids + partial`` with the same ``image_data``. With images the server (the
  real one and this one, ``sglang_mm``) decodes those ids and re-tokenizes them, so a partial
  whose sampled split is not the tokenizer's own comes back as other ids; the project's client
  (``cua_native.engine.remote.CheckedSGLangBackend``) therefore restarts an aborted turn from
  its original request, as on vLLM. Tested with AReaL's ``RemoteSGLangEngine``.
* **vLLM, vision (chat) path**: the server answers an aborted chat request with its partial
  output, as vLLM does, but AReaL's client then re-sends the *original* messages (without the
  partial) and concatenates partial + a fresh answer. The server cannot repair this (the
  resubmission is indistinguishable from a new request, and sending the partial back as text
  would re-tokenize it, which does not reproduce its ids in general), so the fix is on the client:
  ``cua_native.engine.vllm_restart`` makes AReaL's vLLM backend drop an aborted chat partial,
  so the turn restarts cleanly from the original messages under the new weights. The test
  suite shows both AReaL's stock concatenation and the restart with this server.
* vLLM text path (``/v1/completions`` with token ids) continues exactly, like SGLang.
"""

from __future__ import annotations

from typing import Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from cua_native.engine.serve.core import RequestError, ServedModel
from cua_native.engine.serve.sglang_api import sglang_router
from cua_native.engine.serve.vllm_api import vllm_router

Backend = Literal["sglang", "vllm"]
BACKENDS: tuple[Backend, ...] = ("sglang", "vllm")


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": status}, "object": "error"},
        status_code=status,
    )


def build_app(served: ServedModel, backend: Backend) -> FastAPI:
    """The ASGI app speaking ``backend``'s API over ``served``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    app = FastAPI(title=f"cua_native stand-in {backend} server")
    app.include_router(sglang_router(served) if backend == "sglang" else vllm_router(served))

    @app.exception_handler(RequestError)
    async def bad_request(_: Request, exc: RequestError) -> JSONResponse:
        return _error(400, str(exc), "BadRequestError")

    @app.exception_handler(ValidationError)
    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: Exception) -> JSONResponse:
        return _error(400, f"invalid request: {exc}".replace("\n", " "), "BadRequestError")

    @app.exception_handler(RuntimeError)
    async def failed(_: Request, exc: RuntimeError) -> JSONResponse:
        return _error(500, str(exc), "InternalServerError")

    return app


__all__ = ["BACKENDS", "Backend", "RequestError", "ServedModel", "build_app"]
