"""SGLang's native HTTP API, as AReaL 1.0.4's ``SGLangBackend`` calls it.

Routes and shapes follow sgl-project/sglang (``http_server.py``, ``tokenizer_manager.py``,
``schedule_batch.py``):

* ``POST /generate`` with ``input_ids`` (or ``text``), ``image_data`` (base64 or data URIs),
  ``sampling_params``, ``return_logprob``. With images, the ids are decoded and run through
  the model's processor as SGLang's multimodal processor does (``sglang_mm``): one pad per
  image is expanded, pads already expanded fail (500). Answer: ``text``,
  ``output_ids`` and ``meta_info`` with ``id``, ``finish_reason`` (``{"type": "stop",
  "matched": …}``, ``{"type": "length", "length": n}`` or ``{"type": "abort", "message": …}``),
  ``prompt_tokens``, ``completion_tokens`` and, with ``return_logprob``,
  ``output_token_logprobs`` as ``[logprob, token_id, null]`` triples. A request aborted before
  its first token answers SGLang's ``"Abort before prefill"`` with ``prompt_tokens: 0`` and no
  tokens; one aborted while running answers ``"Aborted"`` with the tokens so far, which AReaL
  resubmits as ``input_ids + partial`` (with images the server re-tokenizes that text, so the
  project's client restarts such a turn instead: ``cua_native.engine.remote``).
* ``GET /health``, ``GET|POST /flush_cache``, ``POST /pause_generation`` (``mode`` ``abort``,
  the default; ``retract``/``in_place`` are refused), ``POST /continue_generation``,
  ``POST /update_weights_from_disk`` (``model_path``, ``abort_all_requests``),
  ``POST /init_weights_update_group``, ``POST /update_weights_from_distributed``.

Not served (clear 400): streaming, LoRA, input/top logprobs (AReaL's teacher ``compute_logp``),
routed experts, memory release/resume.

Checked against SGLang's own ``TokenizerManager`` (``tests/conformance``): the ids the stand-in
runs for a payload are the ids SGLang 0.5.10.post1 builds. Where it still differs: a running
request aborted by a pause keeps its partial tokens here and always answers ``"Aborted"``
(SGLang's message varies by release); ``/health`` reports the engine's state without running a
generation (SGLang's ``/health_generate`` runs one); and a continuation is re-tokenized as
0.5.10.post1 does, where 0.5.23 keeps the ids sent (the project's client never sends one).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from areal.api.io_struct import ModelRequest, ModelResponse
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from cua_native.engine.serve.core import RequestError, ServedModel
from cua_native.engine.serve.params import sglang_gconfig
from cua_native.engine.serve.sglang_mm import processed_by_the_server
from cua_native.engine.serve.wire import finish_detail, image_list, read_json, token_ids

ABORT_BEFORE_PREFILL = "Abort before prefill"
"""SGLang's message for a request aborted while queued; AReaL keys on its prefix."""

_REFUSED = {
    "stream": False,
    "lora_path": None,
    "return_routed_experts": False,
    "return_hidden_states": False,
    "custom_logit_processor": None,
    "top_logprobs_num": 0,
    "token_ids_logprob": None,
}


class DiskUpdate(BaseModel):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None


class GroupInit(BaseModel):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class DistributedUpdate(BaseModel):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None


class Pause(BaseModel):
    mode: str = "abort"


def _ok(message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"success": True, "message": message, **extra})


def _failed(message: str) -> JSONResponse:
    return JSONResponse({"success": False, "message": message}, status_code=400)


def _request(served: ServedModel, body: dict[str, Any]) -> tuple[ModelRequest, bool]:
    for key, default in _REFUSED.items():
        if body.get(key, default) not in (default, None, False, 0):
            raise RequestError(f"{key}={body[key]!r} is not supported by the stand-in server")
    start = body.get("logprob_start_len")
    if start is not None and start >= 0:
        raise RequestError("logprob_start_len (input logprobs) is not supported by the stand-in")
    if body.get("input_ids") is not None:
        ids = token_ids(body["input_ids"], "input_ids")
    elif isinstance(body.get("text"), str):
        ids = list(served.tokenizer(body["text"])["input_ids"])
    else:
        raise RequestError("give input_ids (a list of token ids) or text (a string)")
    gconfig, seed = sglang_gconfig(body.get("sampling_params"), served.max_context)
    images = image_list(body.get("image_data"))
    metadata: dict[str, Any] = {} if seed is None else {"seed": seed}
    if images:
        ids, tensors = processed_by_the_server(served.processor, ids, images)
        metadata["multi_modal_input"] = tensors
    req = ModelRequest(
        rid=str(body.get("rid") or uuid.uuid4().hex),
        input_ids=ids,
        gconfig=gconfig,
        image_data=images,
        processor=served.processor,
        tokenizer=served.tokenizer,
        metadata=metadata,
    )
    skip_special = bool((body.get("sampling_params") or {}).get("skip_special_tokens", True))
    return req, skip_special


def generate_response(
    served: ServedModel,
    req: ModelRequest,
    resp: ModelResponse,
    *,
    return_logprob: bool,
    skip_special_tokens: bool,
    latency: float,
) -> dict[str, Any]:
    """SGLang's non-streaming ``/generate`` answer for one finished request."""
    tokens = list(resp.output_tokens)
    if resp.stop_reason == "abort" and not tokens:
        return {
            "text": "",
            "meta_info": {
                "id": req.rid,
                "finish_reason": {"type": "abort", "message": ABORT_BEFORE_PREFILL},
                "prompt_tokens": 0,
                "completion_tokens": 0,
            },
        }
    text = served.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)
    detail = finish_detail(resp.stop_reason, tokens, text, req.gconfig, served)
    if resp.stop_reason == "stop" and isinstance(detail.matched, str):
        text = text[: text.find(detail.matched)]  # SGLang trims a matched stop string
    if resp.stop_reason == "stop":
        finish: dict[str, Any] = {"type": "stop", "matched": detail.matched}
    elif resp.stop_reason == "length":
        finish = {"type": "length", "length": len(tokens)}
    else:
        finish = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": finish,
        "prompt_tokens": len(resp.input_tokens),
        "completion_tokens": len(tokens),
        "cached_tokens": 0,
        "weight_version": str(served.engine.get_version()),
        "e2e_latency": latency,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [
            [float(lp), int(tok), None]
            for lp, tok in zip(resp.output_logprobs, tokens, strict=True)
        ]
    return {"text": text, "output_ids": tokens, "meta_info": meta}


def sglang_router(served: ServedModel) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if served.healthy() else 503)

    @router.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": served.name, "tokenizer_path": served.name, "is_generation": True}

    @router.post("/generate")
    async def generate(request: Request) -> JSONResponse:
        body = await read_json(request)
        # decoding images and running the processor is CPU work: off the event loop
        req, skip_special = await asyncio.to_thread(_request, served, body)
        start = time.perf_counter()
        resp = await served.generate(req)
        return JSONResponse(
            generate_response(
                served,
                req,
                resp,
                return_logprob=bool(body.get("return_logprob")),
                skip_special_tokens=skip_special,
                latency=time.perf_counter() - start,
            )
        )

    @router.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> PlainTextResponse:
        # The in-process engine keeps no prefix cache: nothing outlives a request.
        return PlainTextResponse(
            "Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n"
        )

    @router.post("/pause_generation")
    async def pause_generation(request: Request) -> JSONResponse:
        body = Pause(**await read_json(request, empty_ok=True))
        if body.mode != "abort":
            raise RequestError(f"pause mode {body.mode!r} is not supported (only 'abort')")
        await served.pause()
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @router.post("/continue_generation")
    async def continue_generation(request: Request) -> JSONResponse:
        await read_json(request, empty_ok=True)
        await served.resume()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    @router.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> JSONResponse:
        body = DiskUpdate(**await read_json(request))
        try:
            async with served.exclusive(abort=body.abort_all_requests):
                await served.load_from_disk(body.model_path)
        except (ValueError, OSError) as exc:
            return _failed(f"Failed to update weights: {exc}")
        return _ok("Succeeded to update model weights.", num_paused_requests=0)

    @router.post("/init_weights_update_group")
    async def init_weights_update_group(request: Request) -> JSONResponse:
        body = GroupInit(**await read_json(request))
        try:
            await served.init_group(**body.model_dump())
        except (ValueError, RuntimeError) as exc:
            return _failed(f"Failed to init weights update group: {exc}")
        return _ok("Succeeded to initialize custom process group.")

    @router.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(request: Request) -> JSONResponse:
        body = DistributedUpdate(**await read_json(request))
        try:
            async with served.exclusive(abort=body.abort_all_requests):
                await served.load_from_group(body.group_name, body.names, body.dtypes, body.shapes)
        except (ValueError, RuntimeError) as exc:
            return _failed(f"Failed to update weights: {exc}")
        return _ok("Succeeded to update parameter online.")

    @router.post("/release_memory_occupation")
    @router.post("/resume_memory_occupation")
    async def memory_occupation() -> JSONResponse:
        return _failed("memory release/resume (offload) is not supported by the stand-in server")

    return router
