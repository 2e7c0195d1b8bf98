"""The model behind the stand-in server: an ``InProcessEngine`` plus the server's admission gate.

Both HTTP APIs share these semantics, which are the real servers':

* **Pause** (SGLang ``/pause_generation`` in its default ``abort`` mode, AReaL's vLLM
  ``/areal_pause_generation``): admission closes, every request inside the engine ends with
  ``stop_reason="abort"`` (running ones return the tokens and logprobs generated so far, queued
  ones none) and the call returns once none is left in flight. Requests that arrive while
  paused wait at the gate until **continue**; nothing is rejected.
* **Exclusive updates** (weight loads): admission closes for the update; requests in flight are
  aborted as above (``abort_all_requests``, what AReaL always asks for) or, without it, allowed
  to finish first (SGLang's writer lock). Updates run one at a time.

Everything here runs on the server's event loop; the engine's blocking work (loading a
checkpoint, receiving broadcast tensors) runs on threads.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import torch
from areal.api.io_struct import ModelRequest, ModelResponse

from cua_native.engine.inprocess import InProcessEngine
from cua_native.engine.serve.param_names import own_names
from cua_native.engine.serve.xccl import WeightGroups

ABORT_POLL_S = 0.05
"""How often an abort is re-sent while requests are still in flight (a request that was being
prepared when the first abort went out reaches the engine's queue a moment later)."""


class RequestError(ValueError):
    """The request cannot be served as given (HTTP 400 with this message)."""


class ServedModel:
    """One engine served over HTTP: generation behind a pause gate, and weight updates."""

    def __init__(self, engine: InProcessEngine, name: str) -> None:
        self.engine = engine
        self.name = name
        self.processor = engine.processor
        if engine.tokenizer is None:
            raise ValueError("the served engine has no tokenizer: the server detokenizes output")
        self.tokenizer: Any = engine.tokenizer
        text_config = engine.model.config.get_text_config()
        self.max_context = int(getattr(text_config, "max_position_embeddings", 0) or 1 << 20)
        self.groups = WeightGroups(engine.device)
        self._cond = asyncio.Condition()
        self._paused = False
        self._exclusive = 0
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._update_lock = asyncio.Lock()

    # ------------------------------------------------------------------ state
    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def inflight(self) -> int:
        """Requests admitted and not yet answered."""
        return self._inflight

    def healthy(self) -> bool:
        return self.engine.initialized and self.engine.failure is None

    def _admitting(self) -> bool:
        return not self._paused and self._exclusive == 0

    # ------------------------------------------------------------------ generation
    async def generate(self, req: ModelRequest) -> ModelResponse:
        """Wait for admission, then run ``req`` on the engine. Bad input → ``RequestError``."""
        async with self._cond:
            await self._cond.wait_for(self._admitting)
            self._inflight += 1
            self._idle.clear()
        try:
            return await self.engine.agenerate(req)
        except ValueError as exc:
            raise RequestError(str(exc)) from exc
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    # ------------------------------------------------------------------ pause / continue
    async def pause(self) -> None:
        """Close admission and abort everything in flight; returns when nothing is left."""
        async with self._cond:
            self._paused = True
        await self._abort_inflight()

    async def resume(self) -> None:
        """Reopen admission (requests waiting at the gate go on)."""
        async with self._cond:
            self._paused = False
            if self._admitting():
                self.engine.continue_generation()
            self._cond.notify_all()

    async def _abort_inflight(self) -> None:
        self.engine.pause_generation()  # anything reaching the engine now is held, then aborted
        try:
            while self._inflight:
                self.engine.abort_requests()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._idle.wait(), ABORT_POLL_S)
        finally:
            if not self._paused:
                self.engine.continue_generation()

    @contextlib.asynccontextmanager
    async def exclusive(self, abort: bool) -> AsyncIterator[None]:
        """Hold admission closed around a weight update (see the module docstring)."""
        async with self._update_lock:
            async with self._cond:
                self._exclusive += 1
            try:
                if abort:
                    await self._abort_inflight()
                else:
                    await self._idle.wait()
                yield
            finally:
                async with self._cond:
                    self._exclusive -= 1
                    self._cond.notify_all()

    # ------------------------------------------------------------------ weights
    async def load_from_disk(self, path: str) -> None:
        """Load a ``save_pretrained`` directory into the live model (call inside ``exclusive``)."""
        directory = Path(path)
        if not (directory / "config.json").is_file():
            raise RequestError(f"model_path {path!r} is not a Hugging Face model directory")
        await asyncio.wrap_future(self.engine.update_weights_from_disk(directory))

    async def init_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        backend: str,
        group_name: str,
    ) -> None:
        """Join the trainer's weight-update process group (blocks until every rank joined)."""
        await asyncio.to_thread(
            self.groups.join,
            master_address=master_address,
            master_port=master_port,
            rank=rank_offset,
            world_size=world_size,
            backend=backend,
            group_name=group_name,
        )

    async def load_from_group(
        self,
        group_name: str,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
    ) -> None:
        """Receive the tensors the trainer broadcasts (in ``names`` order) and load them.

        Names may be spelled as SGLang or vLLM know them (``param_names``). A name the model
        lacks is refused only after the broadcast was received: the trainer's side of the
        collective completes and it gets the error, instead of waiting for the group's timeout.
        """
        try:
            targets: list[str] | None = own_names(self.engine.model.state_dict().keys(), names)
            refusal = ""
        except ValueError as exc:
            targets, refusal = None, str(exc)
        received: list[tuple[str, torch.Tensor]] = await asyncio.to_thread(
            self.groups.receive, group_name, names, dtypes, shapes
        )
        if targets is None:
            raise RequestError(refusal)
        renamed = [(target, tensor) for target, (_, tensor) in zip(targets, received, strict=True)]
        try:
            future = self.engine.update_weights_from_state_dict(renamed)
        except ValueError as exc:
            raise RequestError(str(exc)) from exc
        await asyncio.wrap_future(future)
