"""vLLM's OpenAI-compatible API plus AReaL's ``/areal_*`` extensions, as AReaL 1.0.4 calls them.

Shapes follow vllm-project/vllm (``entrypoints/openai``) and AReaL's
``areal/engine/vllm_ext/areal_vllm_server.py``:

* ``POST /v1/completions`` (``prompt`` as token ids or text) and ``POST /v1/chat/completions``
  (``messages`` with inline ``image_url`` parts), flat sampling fields, ``logprobs`` (0/True:
  the sampled token's), ``return_tokens_as_token_ids`` (tokens as ``"token_id:N"``) and
  ``return_token_ids`` (``prompt_token_ids`` and ``token_ids`` in the answer). ``finish_reason``
  is ``stop``, ``length`` or ``abort``; ``stop_reason`` the stop token id or string (None for
  EOS); ``usage.prompt_tokens`` the prompt length the server built.
* ``/areal_pause_generation`` aborts everything in flight (running requests answer
  ``finish_reason: "abort"`` with their partial output, as vLLM's
  ``pause_generation(wait_for_inflight_requests=False)`` does) and holds new ones;
  ``/areal_continue_generation`` releases them. As in AReaL's server, ``/v1/completions`` also
  waits on AReaL's own run event, which only these two endpoints set.
* ``/areal_update_weights`` (disk), ``/areal_init_weights_update_group``,
  ``/areal_set_update_weight_meta`` + ``/areal_update_weights_xccl``: each update pauses the
  engine (aborting what runs), loads, and resumes the engine, exactly like AReaL's server.

What AReaL's client does with an aborted chat answer is the subject of
``cua_native.engine.vllm_restart`` (it concatenates partial + restart:
docs/contracts.md#vllm-chat-abort).
Not served (clear 400): streaming, LoRA, top-k alternatives, prompt logprobs, sleep/wake-up.

Checked against vLLM 0.19.1's own classes (``tests/conformance``): the project's requests
validate as ``ChatCompletionRequest``/``CompletionRequest`` with no unknown field and vLLM's
renderer builds the same prompt ids; this server's answers validate as
``ChatCompletionResponse``/``CompletionResponse``. Where it still differs: log-probs are always
the engine's ``log_softmax(logits / T)`` (vLLM's ``--logprobs-mode processed_logprobs``, which
the project's vLLM config sets; vLLM's default ``raw_logprobs`` leaves out the temperature and
is not emulated), and ``/health`` reports the engine's state without touching the model.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from areal.api.io_struct import ModelRequest, ModelResponse
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from cua_native.engine.serve.chat import chat_prompt
from cua_native.engine.serve.core import RequestError, ServedModel
from cua_native.engine.serve.params import VLLM_COMPLETIONS_DEFAULT_MAX_TOKENS, vllm_gconfig
from cua_native.engine.serve.wire import finish_detail, read_json, token_ids


class DiskUpdate(BaseModel):
    model_path: str
    load_format: str | None = "auto"
    abort_all_requests: bool = False


class GroupInit(BaseModel):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    backend: str
    group_name: str


class WeightMeta(BaseModel):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str


def _result(success: bool, message: str) -> JSONResponse:
    """AReaL's ``build_response`` over one worker (TP rank 0)."""
    line = "TP rank: 0 success\n" if success else f"TP rank: 0 failed. reason: {message}\n"
    return JSONResponse({"success": success, "message": line}, status_code=200 if success else 400)


class _VllmServer:
    """Route handlers over one ``ServedModel`` plus AReaL's run event and xccl metadata."""

    def __init__(self, served: ServedModel) -> None:
        self.served = served
        self.run_event = asyncio.Event()
        self.run_event.set()
        self.weight_meta: WeightMeta | None = None

    # ------------------------------------------------------------------ requests
    def _check_common(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.served.name:
            raise RequestError(f"The model `{model}` does not exist (served: {self.served.name}).")
        if body.get("stream"):
            raise RequestError("stream=true is not supported by the stand-in server")

    def _model_request(
        self, ids: list[int], mm: dict[str, Any], body: dict[str, Any], default_max: int | None
    ) -> ModelRequest:
        gconfig, seed = vllm_gconfig(body, len(ids), self.served.max_context, default_max)
        metadata: dict[str, Any] = {} if seed is None else {"seed": seed}
        if mm:
            metadata["multi_modal_input"] = mm
        return ModelRequest(
            rid=uuid.uuid4().hex,
            input_ids=ids,
            gconfig=gconfig,
            processor=self.served.processor,
            tokenizer=self.served.tokenizer,
            metadata=metadata,
        )

    def _finish(
        self, req: ModelRequest, resp: ModelResponse, skip_special: bool
    ) -> tuple[str, str, int | str | None]:
        """(text, finish_reason, stop_reason) as vLLM reports them."""
        tokens = list(resp.output_tokens)
        text = self.served.tokenizer.decode(tokens, skip_special_tokens=skip_special)
        detail = finish_detail(resp.stop_reason, tokens, text, req.gconfig, self.served)
        stop_reason = detail.matched
        if isinstance(stop_reason, str):
            text = text[: text.find(stop_reason)]
        elif stop_reason is not None and stop_reason not in req.gconfig.stop_token_ids:
            stop_reason = None  # EOS: vLLM reports no stop_reason
        return text, resp.stop_reason, stop_reason

    def _names(self, tokens: list[int], as_ids: bool) -> list[str]:
        if as_ids:
            return [f"token_id:{t}" for t in tokens]
        return [self.served.tokenizer.decode([t]) for t in tokens]

    @staticmethod
    def _usage(prompt: int, completion: int) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": None,
        }

    async def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check_common(body)
        logprobs = body.get("logprobs")
        if logprobs not in (None, 0, False):
            raise RequestError("logprobs > 0 (top alternatives) is not supported; use 0")
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = list(self.served.tokenizer(prompt)["input_ids"])
        else:
            ids = token_ids(prompt, "prompt")
        req = self._model_request(ids, {}, body, VLLM_COMPLETIONS_DEFAULT_MAX_TOKENS)
        await self.run_event.wait()  # AReaL's wrapper of /v1/completions
        resp = await self.served.generate(req)
        text, finish, stop = self._finish(req, resp, body.get("skip_special_tokens", True))
        tokens = list(resp.output_tokens)
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": stop,
            "prompt_logprobs": None,
        }
        if logprobs is not None:
            names = self._names(tokens, bool(body.get("return_tokens_as_token_ids")))
            pieces = [self.served.tokenizer.decode([t]) for t in tokens]
            offsets = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
            lps = [float(x) for x in resp.output_logprobs]
            choice["logprobs"] = {
                "text_offset": offsets,
                "token_logprobs": lps,
                "tokens": names,
                "top_logprobs": [{n: lp} for n, lp in zip(names, lps, strict=True)],
            }
        if body.get("return_token_ids"):
            choice["prompt_token_ids"] = list(ids)
            choice["token_ids"] = tokens
        return {
            "id": f"cmpl-{req.rid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.served.name,
            "choices": [choice],
            "usage": self._usage(len(ids), len(tokens)),
        }

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check_common(body)
        if body.get("top_logprobs"):
            raise RequestError("top_logprobs > 0 is not supported by the stand-in server")
        served = self.served
        prompt = await asyncio.to_thread(
            chat_prompt,
            served.processor,
            served.tokenizer,
            body.get("messages") or [],
            add_generation_prompt=bool(body.get("add_generation_prompt", True)),
            continue_final_message=bool(body.get("continue_final_message", False)),
            chat_template_kwargs=body.get("chat_template_kwargs"),
        )
        req = self._model_request(prompt.input_ids, prompt.mm, body, None)
        resp = await served.generate(req)
        text, finish, stop = self._finish(req, resp, body.get("skip_special_tokens", True))
        tokens = list(resp.output_tokens)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": stop,
        }
        if body.get("logprobs"):
            names = self._names(tokens, bool(body.get("return_tokens_as_token_ids")))
            choice["logprobs"] = {
                "content": [
                    {
                        "token": n,
                        "logprob": float(lp),
                        "bytes": list(n.encode()),
                        "top_logprobs": [],
                    }
                    for n, lp in zip(names, resp.output_logprobs, strict=True)
                ]
            }
        out: dict[str, Any] = {
            "id": f"chatcmpl-{req.rid}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": served.name,
            "choices": [choice],
            "usage": self._usage(len(prompt.input_ids), len(tokens)),
            "prompt_logprobs": None,
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = tokens
            out["prompt_token_ids"] = list(prompt.input_ids)
        return out

    # ------------------------------------------------------------------ AReaL endpoints
    async def pause(self) -> JSONResponse:
        self.run_event.clear()
        await self.served.pause()
        return JSONResponse(
            {"success": True, "message": "Generation paused and all requests aborted"}
        )

    async def resume(self) -> JSONResponse:
        await self.served.resume()
        self.run_event.set()
        return JSONResponse({"success": True, "message": "Generation continued"})

    async def _paused_update(self, load: Any) -> JSONResponse:
        """AReaL: ``pause_generation`` (abort), load, ``resume_generation`` — the engine is
        resumed afterwards even if a client pause was in force (AReaL's run event is not)."""
        try:
            async with self.served.exclusive(abort=True):
                await load()
        except (ValueError, RuntimeError, OSError) as exc:
            return _result(False, str(exc))
        finally:
            await self.served.resume()
        return _result(True, "")

    async def update_from_disk(self, body: DiskUpdate) -> JSONResponse:
        return await self._paused_update(lambda: self.served.load_from_disk(body.model_path))

    async def init_group(self, body: GroupInit) -> JSONResponse:
        try:
            await self.served.init_group(**body.model_dump())
        except (ValueError, RuntimeError) as exc:
            return _result(False, f"Failed to init group! {exc}.")
        return _result(True, "")

    async def update_from_group(self) -> JSONResponse:
        meta = self.weight_meta
        if meta is None:
            return _result(False, "call /areal_set_update_weight_meta first")
        return await self._paused_update(
            lambda: self.served.load_from_group(
                meta.group_name, meta.names, meta.dtypes, meta.shapes
            )
        )


def vllm_router(served: ServedModel) -> APIRouter:
    router = APIRouter()
    server = _VllmServer(served)

    @router.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if served.healthy() else 503)

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": served.name,
            "object": "model",
            "owned_by": "cua_native",
            "root": served.name,
            "max_model_len": served.max_context,
        }
        return {"object": "list", "data": [card]}

    @router.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        return JSONResponse(await server.completions(await read_json(request)))

    @router.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        return JSONResponse(await server.chat(await read_json(request)))

    @router.post("/areal_pause_generation")
    async def pause() -> JSONResponse:
        return await server.pause()

    @router.post("/areal_continue_generation")
    async def resume() -> JSONResponse:
        return await server.resume()

    @router.post("/areal_update_weights")
    async def update_weights(request: Request) -> JSONResponse:
        return await server.update_from_disk(DiskUpdate(**await read_json(request)))

    @router.post("/areal_init_weights_update_group")
    async def init_group(request: Request) -> JSONResponse:
        return await server.init_group(GroupInit(**await read_json(request)))

    @router.post("/areal_set_update_weight_meta")
    async def set_meta(request: Request) -> JSONResponse:
        server.weight_meta = WeightMeta(**await read_json(request))
        return _result(True, "")

    @router.post("/areal_update_weights_xccl")
    async def update_xccl() -> JSONResponse:
        return await server.update_from_group()

    @router.post("/areal_update_weights_lora")
    @router.post("/areal_update_weights_lora_xccl")
    @router.post("/areal_set_update_weight_meta_lora")
    @router.post("/v1/load_lora_adapter")
    async def lora() -> JSONResponse:
        return _result(False, "LoRA is not supported by the stand-in server")

    @router.post("/sleep")
    @router.post("/wake_up")
    async def sleep() -> JSONResponse:
        return _result(False, "sleep/wake_up (offload) is not supported by the stand-in server")

    return router
