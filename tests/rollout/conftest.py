"""Shared fixtures: the tiny Qwen3-VL (built once per session), its processor, the real
in-process engine, a scripted test engine, and a gym wrapper that fails on demand."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from areal.api.io_struct import ModelRequest, ModelResponse

from cua_native.actions.models import Action
from cua_native.gym.protocol import Execution, Gym, GymError, Task
from cua_native.rollout.factories import load_processor, tiny_model_dir


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def processor(tiny_dir: Path) -> Any:
    return load_processor(tiny_dir)


@pytest.fixture(scope="session")
def inprocess_engine(tiny_dir: Path) -> Iterator[Any]:
    from cua_native.engine import InProcessEngine

    engine = InProcessEngine.from_pretrained(str(tiny_dir), device="cpu", seed=0)
    try:
        yield engine
    finally:
        engine.destroy()


class ScriptedEngine:
    """A real ``agenerate`` for tests: answers each episode's n-th call with ``script(n)``
    written in the dialect's own format and tokenized, so the loop parses and executes it
    exactly as model output. Per-token logprobs are a fixed value (no model behind it)."""

    def __init__(
        self,
        tokenizer: Any,
        dialect: Any,
        script: Callable[[int], Action | str],
        stop_id: int,
        latency: float = 0.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.dialect = dialect
        self.script = script
        self.stop_id = stop_id
        self.latency = latency
        self.calls: dict[str, int] = {}

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        episode = str(req.metadata.get("episode_id", ""))
        turn = self.calls.get(episode, 0)
        self.calls[episode] = turn + 1
        if self.latency:
            await asyncio.sleep(self.latency)
        step = self.script(turn)
        text = step if isinstance(step, str) else self.dialect.format(step, thought="go")
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.stop_id]
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=ids,
            output_logprobs=[-0.5] * len(ids),
            output_versions=[0] * len(ids),
            stop_reason="stop",
        )


class FaultyGym:
    """Wraps a real gym; raises ``GymError`` on the calls named in ``fail`` (``"start"``,
    ``"observe"``, ``"act"``, ``"evaluate"``; each with the 1-based call counts that fail, or
    ``None`` for all) or hangs on ``hang``; counts executions started and closed."""

    def __init__(
        self,
        inner: Gym,
        fail: dict[str, set[int] | None] | None = None,
        hang: set[str] | None = None,
    ) -> None:
        self.inner = inner
        self.gym_id = inner.gym_id
        self.fail = fail or {}
        self.hang = hang or set()
        self.counts: dict[str, int] = {}
        self.started = 0
        self.closed = 0

    async def check(self, call: str) -> None:
        self.counts[call] = self.counts.get(call, 0) + 1
        if call in self.hang:
            await asyncio.sleep(3600)
        if call in self.fail:
            which = self.fail[call]
            if which is None or self.counts[call] in which:
                raise GymError(f"injected {call} failure #{self.counts[call]}")

    async def list_tasks(self) -> list[Task]:
        return await self.inner.list_tasks()

    async def get_task(self, task_id: str) -> Task:
        return await self.inner.get_task(task_id)

    async def start(self, task: Task, options: dict[str, Any] | None = None) -> Execution:
        await self.check("start")
        execution = await self.inner.start(task, options)
        self.started += 1
        return _FaultyExecution(execution, self)  # type: ignore[return-value]

    async def aclose(self) -> None:
        await self.inner.aclose()


class _FaultyExecution:
    def __init__(self, inner: Execution, gym: FaultyGym) -> None:
        self.inner = inner
        self.gym = gym
        self.execution_id = inner.execution_id
        self.task = inner.task
        self.closes = 0

    async def observe(self) -> Any:
        await self.gym.check("observe")
        return await self.inner.observe()

    async def act(self, action: Any) -> Any:
        await self.gym.check("act")
        return await self.inner.act(action)

    async def evaluate(self, answer: str | None = None) -> Any:
        await self.gym.check("evaluate")
        return await self.inner.evaluate(answer)

    async def close(self) -> None:
        await self.inner.close()
        if self.closes == 0:
            self.gym.closed += 1
        self.closes += 1


@pytest.fixture
def scripted_engine_factory(processor: Any) -> Callable[..., ScriptedEngine]:
    from cua_native.rollout.factories import stop_token_ids

    def make(dialect: Any, script: Callable[[int], Action | str], latency: float = 0.0):
        tokenizer = processor.tokenizer
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert im_end in stop_token_ids(tokenizer)
        return ScriptedEngine(tokenizer, dialect, script, im_end, latency)

    return make


@pytest.fixture
def faulty_gym_factory() -> Callable[..., FaultyGym]:
    from cua_native.gym.sim import SimGym

    def make(**kwargs: Any) -> FaultyGym:
        return FaultyGym(SimGym(seed=0), **kwargs)

    return make
