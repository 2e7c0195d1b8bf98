"""Episode records and a real ingest server (the dashboard app under uvicorn) for the tests."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from PIL import Image
from sqlalchemy import func, select

from cua_native.actions.errors import ParsedOutput, failure
from cua_native.actions.models import Click, Terminate
from cua_native.gym.protocol import (
    Evaluation,
    Observation,
    Screenshot,
    StepResult,
    Task,
    ValidatorResult,
)
from cua_native.monitor.db.store import MonitorStore
from cua_native.monitor.service.dashboard.app import create_app
from cua_native.rollout.records import EndReason, EpisodeContext, EpisodeRecord, TurnRecord

TOKEN = "test-token"


def make_task(task_id: str = "task-1") -> Task:
    return Task(task_id=task_id, name=f"Task {task_id}", instruction="Open settings", max_steps=5)


def make_context(task: Task, step: int = 0, source: str = "step") -> EpisodeContext:
    return EpisodeContext(task=task, group_id="g0", source=source, step=step)  # type: ignore[arg-type]


def screenshot(color: tuple[int, int, int]) -> Screenshot:
    return Screenshot(image=Image.new("RGB", (64, 128), color))


def make_turn(
    index: int, before: Screenshot, after: Screenshot, *, bad: bool = False
) -> TurnRecord:
    parsed = (
        failure("format", "no tool call", thought="hmm")
        if bad
        else ParsedOutput(action=Click(x=0.25, y=0.5), thought=f"tap {index}")
    )
    return TurnRecord(
        index=index,
        observation=Observation(screenshot=before, width=64, height=128, turn=index),
        prompt_ids=[1, 2, 3],
        output_ids=[10 + index, 11, 12],
        output_logprobs=[-0.1, -0.2, -0.3],
        output_versions=[0, 0, 0],
        text=f"output {index}",
        parsed=parsed,
        step=None if bad else StepResult(ok=True, observation=Observation(after, 64, 128)),
        timings={"generate": 0.5, "act": 0.25},
        reward=0.5,
    )


def run_episode_turns(context: EpisodeContext, count: int) -> list[TurnRecord]:
    shots = [screenshot((i * 40 % 255, 0, 0)) for i in range(count + 1)]
    return [make_turn(i, shots[i], shots[i + 1]) for i in range(count)]


def finish(context: EpisodeContext, turns: list[TurnRecord]) -> EpisodeRecord:
    last = ParsedOutput(action=Terminate(status="success"))
    if turns:
        turns[-1].parsed = last
    return EpisodeRecord(
        context=context,
        turns=turns,
        evaluation=Evaluation(
            reward=1.0,
            success=True,
            validators=(ValidatorResult(id="v1", passed=True, score=1.0),),
            raw={"score": 1.0},
        ),
        reward=1.0,
        success=True,
        end_reason=EndReason.TERMINATE,
        timings={"generate": 1.0},
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def ingest_server(store: MonitorStore, port: int) -> AsyncIterator[str]:
    """The dashboard (with ingest) served over loopback until the block ends."""
    config = uvicorn.Config(
        create_app(store, token=TOKEN), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def wait_for(predicate: Any, within: float = 120.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


def count(store: MonitorStore, model: Any) -> int:
    """Rows of one table in the store."""
    with store.session() as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def record_episode(recorder: Any, task_id: str, turns: int = 2, step: int = 0) -> str:
    """One finished episode of ``turns`` turns recorded through ``recorder``."""
    context = make_context(make_task(task_id), step=step)
    recorder.episode_started(context)
    records = run_episode_turns(context, turns)
    for turn in records:
        recorder.turn_finished(context, turn)
    recorder.episode_finished(finish(context, records))
    return context.episode_id
