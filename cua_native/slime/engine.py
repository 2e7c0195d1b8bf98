"""The episode loop's engine on slime's SGLang servers: the AReaL SGLang path's requests, sent to
slime's router.

``RouterEngine.agenerate`` speaks our loop's ``Engine`` protocol (AReaL's ``ModelRequest`` in,
``ModelResponse`` out) and builds every HTTP call with the backend of the AReaL cluster path,
``cua_native.engine.remote.CheckedSGLangBackend``, so both paths send SGLang the same bytes: a
vision turn with one image pad per image (SGLang's multimodal processor expands them into exactly
the prompt builder's ids, proven against SGLang's own code in ``tests/conformance``), the
sampling parameters AReaL 1.0.4 builds, ``return_logprob``; the server's prompt count goes to the
turn's ``PromptReport`` (a mismatch rejects the episode as ``token_mismatch``) and an answer a
pause aborted is restarted, never continued (``engine/sglang_vision.py``).

The loop is AReaL's ``RemoteInfEngine.agenerate`` (accumulate until ``stop``/``length``;
``max_new_tokens`` bounded by ``max_tokens - prompt``), without its worker pool and pause flag:
slime drives the servers itself (``/generate`` through its router, weight updates between
rollouts). Weight versions: each answer's tokens are labelled with the version the server says
generated them (``meta_info.weight_version``, what slime's own ``Sample`` records), overriding the
build version in the turn's ``ServedVersions``; a server that reports none (or a non-integer,
SGLang's ``"default"``) keeps the last version seen, 0 at first.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from areal.api.io_struct import ModelRequest, ModelResponse

from cua_native.engine.remote import CheckedSGLangBackend
from cua_native.engine.versions import current_served

FINAL = ("stop", "tool_calls", "length")


class RouterEngine:
    """``agenerate`` over ``POST {base_url}/generate`` (slime's SGLang router or one server).

    ``timeout_s`` bounds each HTTP call; ``abort_wait_s`` is the pause before re-sending a turn
    the server aborted (slime aborts in-flight requests around weight updates). The episode's
    turn timeout bounds the whole call. One ``httpx.AsyncClient`` per event loop, closed by
    ``aclose``."""

    def __init__(self, base_url: str, *, timeout_s: float = 600.0, abort_wait_s: float = 1.0):
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.abort_wait_s = abort_wait_s
        self.backend = CheckedSGLangBackend()
        self.version = 0
        self._client: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient] | None = None

    def get_version(self) -> int:
        """The last weight version a server reported (0 before any)."""
        return self.version

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client[0] is not loop:
            self._client = (loop, httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s)))
        return self._client[1]

    async def aclose(self) -> None:
        """Close the HTTP client (on the loop that opened it)."""
        client, self._client = self._client, None
        if client is not None and client[0] is asyncio.get_running_loop():
            await client[1].aclose()

    async def _post(self, endpoint: str, payload: dict[str, Any]) -> dict[str, Any]:
        response = await self._http().post(f"{self.base_url}{endpoint}", json=payload)
        response.raise_for_status()
        body = response.json()
        if not isinstance(body, dict):
            raise ValueError(f"expected a JSON object from {endpoint}, got {type(body).__name__}")
        return body

    def _note_version(self, body: dict[str, Any]) -> None:
        reported = (body.get("meta_info") or {}).get("weight_version")
        try:
            version = int(reported) if reported is not None else None
        except (TypeError, ValueError):
            version = None
        if version is None:
            return
        self.version = version
        served = current_served()
        if served is not None:
            served.built(version)  # the answer's own version labels its tokens

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        req = req.copy()
        gconfig = req.gconfig
        if gconfig.n_samples != 1:
            raise ValueError("one answer per request: n_samples must be 1")
        budget = min(gconfig.max_tokens - len(req.input_ids), gconfig.max_new_tokens)
        if budget <= 0:
            raise RuntimeError(
                f"no room to generate: max_tokens={gconfig.max_tokens}, "
                f"prompt={len(req.input_ids)}, max_new_tokens={gconfig.max_new_tokens}"
            )
        gconfig.max_new_tokens = budget
        prompt = list(req.input_ids)
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        stop: str | None = None
        start = time.perf_counter()
        while stop not in FINAL and len(tokens) < budget:
            http = self.backend.build_generation_request(req, False, self.version)
            body = await self._post(http.endpoint, http.payload)
            self._note_version(body)
            result = self.backend.parse_generation_response(body)
            stop = result.stop_reason
            tokens += result.output_tokens
            logprobs += result.output_logprobs
            versions += [self.version] * len(result.output_tokens)
            req.input_ids += result.output_tokens
            gconfig.max_new_tokens -= len(result.output_tokens)
            if stop == "abort":
                await asyncio.sleep(self.abort_wait_s)
        latency = time.perf_counter() - start
        return ModelResponse(
            input_tokens=prompt,
            input_images=req.image_data or [],
            output_tokens=tokens,
            output_logprobs=logprobs,
            output_versions=versions,
            stop_reason="length" if stop == "abort" else stop,  # AReaL: budget used up
            latency=latency,
            ttft=latency,
            tokenizer=req.tokenizer,
            processor=req.processor,
        )
