"""The Rollout Buffer of slime's agent-rollout guide, backed by the CUA episode loop.

slime's side (``slime_plugins/rollout_buffer/rollout_buffer_example.py`` at the pinned commit,
with ``--rollout-function-path`` naming it or ``cua_native.slime.buffer_client``) calls two
routes, which this server answers as slime's own buffer (``slime_plugins/rollout_buffer/buffer.py``)
does:

- ``POST /start_rollout`` with slime's arguments (``num_process``, ``num_epoch``,
  ``remote_engine_url``, ``task_type``, ``input_file``, ``num_repeat_per_sample``,
  ``max_tokens``, ``sampling_params``, ``tokenizer_path``, ``skip_instance_ids``, numbers as
  strings): starts the producer, ``{"message": "Rollout started"}``; again while it runs,
  ``{"message": "Rollout already running"}``; a payload it cannot run is HTTP 400 with one line.
  ``task_type`` must be ``cua`` (``--rollout-task-type cua``).
- ``POST /get_rollout_data`` (the body is ignored, as slime's buffer ignores it: the guide's
  ``num`` is not sent by slime's client at the pinned commit):
  ``{"success", "message", "data": {"data": [...], "meta_info": {...}}}``,
  every item of the groups finished since the last read (``success`` false and no items while
  there are none). Items are whole groups only: ``num_repeat_per_sample`` episodes of one
  ``instance_id``; a group the loop drops (an episode rejected again, or one without a turn) is
  never sent. ``meta_info``: ``total_samples`` and ``avg_reward`` (episodes and their mean raw
  reward, what slime's ``log_raw_info`` logs), ``num_groups``, ``dropped_groups`` and
  ``finished_groups`` (the ``instance_id``s sent, which slime's client keeps and sends back as
  ``skip_instance_ids`` on a resumed run).

The producer plays every row of ``input_file`` (JSONL; each row an ``instance_id`` and the task,
as ``python -m cua_native.slime tasks`` writes them) ``num_epoch`` times, skipping
``skip_instance_ids``, at most ``num_process`` groups at once, through the AReaL path's group
runner and the SGLang requests of ``cua_native.slime.engine`` to ``remote_engine_url``; the
agent takes ``tokenizer_path`` as its model, ``sampling_params`` as its sampling and
``num_repeat_per_sample`` as its group size. One item per episode (``samples.record_for``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from cua_native.config import CUASettings
from cua_native.rollout.episode import EpisodeRun
from cua_native.rollout.records import EpisodeObserver
from cua_native.rollout.trajectory import attribute_rewards
from cua_native.rollout.workflow import CUAAgentWorkflow, task_from_row
from cua_native.slime.engine import RouterEngine
from cua_native.slime.samples import record_for
from cua_native.slime.settings import SlimeArgsError, agent_for_slime

logger = logging.getLogger(__name__)

TASK_TYPE = "cua"


class StartError(ValueError):
    """A ``/start_rollout`` payload the buffer cannot run (one line)."""


@dataclass(frozen=True, slots=True)
class StartRequest:
    """What the buffer uses of slime's ``start_rollout`` payload."""

    engine_url: str
    input_file: Path
    group_size: int
    epochs: int
    concurrency: int
    model_path: str
    temperature: float
    top_p: float
    max_new_tokens: int
    skip: frozenset[str]

    @classmethod
    def parse(cls, payload: Any) -> StartRequest:
        if not isinstance(payload, dict):
            raise StartError("the start payload is not a JSON object")
        if payload.get("task_type") != TASK_TYPE:
            raise StartError(
                f"task_type {payload.get('task_type')!r}: this buffer runs '{TASK_TYPE}' "
                f"(--rollout-task-type {TASK_TYPE})"
            )
        sampling = payload.get("sampling_params") or {}
        if not isinstance(sampling, dict):
            raise StartError("sampling_params is not an object")
        skip = payload.get("skip_instance_ids") or []
        if not isinstance(skip, list):
            raise StartError("skip_instance_ids is not a list")
        try:
            request = cls(
                engine_url=_text(payload, "remote_engine_url"),
                input_file=Path(_text(payload, "input_file")),
                group_size=_count(payload, "num_repeat_per_sample"),
                epochs=_count(payload, "num_epoch"),
                concurrency=_count(payload, "num_process"),
                model_path=_text(payload, "tokenizer_path"),
                temperature=float(sampling.get("temperature", 1.0)),
                top_p=float(sampling.get("top_p", 1.0)),
                max_new_tokens=int(sampling.get("max_tokens", payload.get("max_tokens")) or 0),
                skip=frozenset(str(item) for item in skip),
            )
        except (TypeError, ValueError) as error:
            if isinstance(error, StartError):
                raise
            raise StartError(f"bad start payload: {error}") from error
        parts = urlsplit(request.engine_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise StartError(f"remote_engine_url {request.engine_url!r} is not http(s)://host:port")
        if not request.input_file.is_file():
            raise StartError(f"input_file {request.input_file} is not a file this buffer can read")
        return request


def _text(payload: dict[str, Any], key: str) -> str:
    value = payload.get(key)
    if not isinstance(value, str) or not value:
        raise StartError(f"{key} is missing")
    return value


def _count(payload: dict[str, Any], key: str) -> int:
    try:
        value = int(payload.get(key) or 0)
    except (TypeError, ValueError) as error:
        raise StartError(f"{key} {payload.get(key)!r} is not a whole number") from error
    if value < 1:
        raise StartError(f"{key} must be at least 1, got {value}")
    return value


def read_rows(path: Path, skip: frozenset[str]) -> list[dict[str, Any]]:
    """The input file's rows (``instance_id`` + task), without the skipped ones; ``StartError``
    naming the first bad line."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            instance = str(row["instance_id"])
            task_from_row(row.get("metadata") or row)
        except (ValueError, KeyError, TypeError) as error:
            raise StartError(
                f"{path}:{number}: not a task row with an instance_id ({error})"
            ) from error
        if instance not in skip:
            rows.append(row)
    if not rows:
        raise StartError(f"{path} has no task left to play")
    return rows


@dataclass
class Tally:
    """What happened since the last read (``meta_info``)."""

    episodes: int = 0
    reward_sum: float = 0.0
    groups: int = 0
    dropped: int = 0

    def meta(self, finished: list[str]) -> dict[str, Any]:
        return {
            "total_samples": self.episodes,
            "avg_reward": self.reward_sum / self.episodes if self.episodes else 0.0,
            "num_groups": self.groups,
            "dropped_groups": self.dropped,
            "finished_groups": finished,
        }


@dataclass
class RolloutBuffer:
    """The buffer's state: finished groups' items waiting to be read, the producer."""

    cua: CUASettings
    observer: EpisodeObserver | None = None
    items: list[dict[str, Any]] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    tally: Tally = field(default_factory=Tally)
    producer: asyncio.Task[None] | None = None
    failure: str | None = None

    async def start(self, payload: Any) -> dict[str, str]:
        if self.producer is not None and not self.producer.done():
            return {"message": "Rollout already running"}
        request = StartRequest.parse(payload)
        rows = await asyncio.to_thread(read_rows, request.input_file, request.skip)
        try:
            agent = agent_for_slime(
                self.cua.agent,
                model_path=request.model_path,
                temperature=request.temperature,
                top_p=request.top_p,
                top_k=self.cua.agent.sampling.top_k,
                max_new_tokens=request.max_new_tokens,
                group_size=request.group_size,
            )
        except SlimeArgsError as error:
            raise StartError(str(error)) from error
        engine = RouterEngine(request.engine_url, timeout_s=agent.turn_timeout_s)
        workflow = CUAAgentWorkflow(agent, source="step", observer=self.observer)
        self.failure = None
        self.producer = asyncio.create_task(self._produce(request, rows, engine, workflow))
        return {"message": "Rollout started"}

    async def _produce(
        self,
        request: StartRequest,
        rows: list[dict[str, Any]],
        engine: RouterEngine,
        workflow: CUAAgentWorkflow,
    ) -> None:
        slots = asyncio.Semaphore(request.concurrency)
        agent = workflow.config

        async def play(row: dict[str, Any], epoch: int) -> None:
            async with slots:
                task = task_from_row(row.get("metadata") or row)
                runs = await workflow.play_group(engine, task, {"global_step": epoch})
            self._add(
                str(row["instance_id"]),
                runs,
                agent.turn_discount,
                agent.group_reward_norm,
                agent.reward_norm_eps,
            )

        try:
            for epoch in range(request.epochs):
                await asyncio.gather(*(play(row, epoch) for row in rows))
        except Exception as error:
            self.failure = f"{type(error).__name__}: {error}"
            logger.exception("the rollout producer stopped")
        finally:
            await workflow.aclose()
            await engine.aclose()

    def _add(
        self,
        instance_id: str,
        runs: list[EpisodeRun] | None,
        gamma: float,
        normalize: bool | str,
        eps: float,
    ) -> None:
        if runs is None or any(not run.record.turns for run in runs):
            self.tally.dropped += 1
            return
        per_turn = attribute_rewards(runs, gamma=gamma, normalize=normalize, eps=eps)
        # the last turn's reward is the episode's normalised reward (discounted by gamma ** 0)
        self.items.extend(
            record_for(run, instance_id, turns[-1], turns)
            for run, turns in zip(runs, per_turn, strict=True)
        )
        self.finished.append(instance_id)
        self.tally.episodes += len(runs)
        self.tally.reward_sum += sum(run.record.reward for run in runs)
        self.tally.groups += 1

    def read(self) -> dict[str, Any]:
        """``/get_rollout_data``'s answer; the items and the tally are handed over once."""
        meta = self.tally.meta(list(self.finished))
        if self.failure is not None:
            meta["producer_failure"] = self.failure
        if not self.items:
            return {
                "success": False,
                "message": "No data available to read",
                "data": {"data": [], "meta_info": meta},
            }
        items, self.items, self.finished, self.tally = self.items, [], [], Tally()
        return {
            "success": True,
            "message": f"Successfully read {len(items)} items",
            "data": {"data": items, "meta_info": meta},
        }

    async def aclose(self) -> None:
        if self.producer is not None and not self.producer.done():
            self.producer.cancel()
            await asyncio.gather(self.producer, return_exceptions=True)


def build_app(buffer: RolloutBuffer) -> FastAPI:
    """The buffer's two routes (see the module docstring); the producer stops with the app."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await buffer.aclose()

    app = FastAPI(title="cua_native rollout buffer", lifespan=lifespan)

    @app.post("/start_rollout")
    async def start_rollout(request: Request) -> JSONResponse:
        try:
            payload = await request.json()
            return JSONResponse(await buffer.start(payload))
        except (StartError, json.JSONDecodeError) as error:
            return JSONResponse({"detail": str(error)}, status_code=400)

    @app.post("/get_rollout_data")
    async def get_rollout_data() -> JSONResponse:
        return JSONResponse(buffer.read())

    return app
