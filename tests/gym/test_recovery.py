"""Recovery at the call, against the real gym server and client over loopback and the real
simulator: idempotent actions (a lost answer costs a retry, the action runs once), a lost
execution restored by exact replay and checked against the last screen seen, and a crash that
happens when the request arrives (never after a retry of the same call was answered)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from cua_native.actions.models import Click, Swipe
from cua_native.gym.faults import FaultInjector, FaultProfile, Route
from cua_native.gym.http import (
    ExecutionNotFound,
    GymTimeouts,
    GymUnavailable,
    HttpGym,
    RetryPolicy,
)
from cua_native.gym.protocol import (
    Execution,
    ExecutionGone,
    StepResult,
    Task,
    gym_replays_exactly,
)
from cua_native.gym.recovery import RecoveryFailed, ReplayingExecution, observation_digest
from cua_native.gym.server import create_app
from cua_native.gym.sim import SimGym

GENEROUS = GymTimeouts(
    connect=30.0, read=60.0, create=60.0, act=60.0, evaluate=60.0, terminate=60.0
)
"""No timeout is meant to fire: limits a loaded machine never reaches."""
RETRY = RetryPolicy(attempts=3, backoff_s=0.0, backoff_max_s=0.0, throttle_retries=2)
ACTIONS = (Click(x=0.5, y=0.3), Swipe(direction="up"), Click(x=0.2, y=0.8))


def _seed_with_fates(route: Route, field: str, fates: tuple[bool, ...], **profile: Any) -> int:
    """The first profile seed whose first requests to ``route`` meet ``field`` exactly as
    ``fates`` says (the injector is seeded: the fates of a seed never change)."""
    for seed in range(10_000):
        injector = FaultInjector(FaultProfile(seed=seed, **profile))
        if tuple(bool(getattr(injector.decide(route), field)) for _ in fates) == fates:
            return seed
    raise AssertionError(f"no seed gives {field} fates {fates}")


async def _sim_task(gym: SimGym) -> Task:
    return (await gym.list_tasks())[0]


def _live_sim(app: Any, execution_id: str) -> Any:
    return app.state.gym_server.live[("sim", execution_id)]


# ----------------------------------------------------------------- idempotent actions
async def test_an_action_whose_answer_was_lost_after_it_acted_runs_once(serve) -> None:
    """The server acts, then the connection drops before the answer; the client retries with
    the same idempotency key and gets the stored answer: the phone turned once."""
    share = {"actions": 0.5}
    seed = _seed_with_fates("actions", "drop_after", (True, False), drop_after_share=share)
    sim = SimGym(seed=0, screenshot_size=(160, 384))
    app = create_app({"sim": sim}, FaultProfile(seed=seed, drop_after_share=share))
    async with serve(app) as url:
        gym = HttpGym(url, "sim", retries=RETRY, timeouts=GENEROUS)
        execution = await gym.start(await _sim_task(sim))
        try:
            result = await execution.act(ACTIONS[0])
            live = _live_sim(app, execution.execution_id)
            assert gym.call_stats.retries == 1  # the lost answer cost one retry
            assert live.acted == 1 and live.execution.state.turn == 1  # acted once
            assert result.observation is not None and result.observation.turn == 1
            second = await execution.act(ACTIONS[1])
            assert second.observation is not None and second.observation.turn == 2
            assert live.acted == 2 and live.execution.state.turn == 2
        finally:
            await execution.close()
            await gym.aclose()
    assert not app.state.gym_server.live


async def test_without_idempotency_the_same_loss_is_never_retried(serve) -> None:
    """A server that does not say ``idempotent_actions`` gets no retry of an action: the lost
    answer is the caller's failure (and the phone did turn: a retry would have acted twice)."""
    share = {"actions": 0.5}
    seed = _seed_with_fates("actions", "drop_after", (True,), drop_after_share=share)
    sim = SimGym(seed=0, screenshot_size=(160, 384))
    app = create_app({"sim": sim}, FaultProfile(seed=seed, drop_after_share=share))
    async with serve(app) as url:
        gym = HttpGym(url, "sim", retries=RETRY, timeouts=GENEROUS)
        caps = await gym.capabilities()
        assert caps["idempotent_actions"] is True and caps["replays_exactly"] is True
        gym._capabilities = {**caps, "idempotent_actions": False}  # as an older server says
        execution = await gym.start(await _sim_task(sim))
        try:
            with pytest.raises(GymUnavailable, match="connection failed mid-request"):
                await execution.act(ACTIONS[0])
            assert gym.call_stats.retries == 0
            assert _live_sim(app, execution.execution_id).execution.state.turn == 1
        finally:
            await execution.close()
            await gym.aclose()


async def test_a_repeated_key_gets_the_stored_answer_and_another_action_409() -> None:
    sim = SimGym(seed=0, screenshot_size=(160, 384))
    app = create_app({"sim": sim})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gym") as client:
        task = await _sim_task(sim)
        created = (await client.post(f"/api/v1/sim/tasks/{task.task_id}", json={})).json()
        path = f"/api/v1/sim/executions/{created['execution_id']}/actions"
        body = {"action": {"type": "click", "x": 0.5, "y": 0.3}}
        key = {"Idempotency-Key": "k0"}
        first = await client.post(path, json=body, headers=key)
        again = await client.post(path, json=body, headers=key)
        other = await client.post(path, json={"action": {"type": "wait"}}, headers=key)
        assert first.status_code == again.status_code == 200
        assert first.json() == again.json()
        assert other.status_code == 409
        live = _live_sim(app, created["execution_id"])
        assert live.acted == 1 and live.execution.state.turn == 1
        await live.execution.close()


# ----------------------------------------------------------------- restore by replay
async def _play(execution: Execution) -> list[str]:
    """Observe, then act ``ACTIONS``; the digest of every screen seen."""
    seen = [observation_digest(await execution.observe())]
    for action in ACTIONS:
        result = await execution.act(action)
        assert result.observation is not None
        seen.append(observation_digest(result.observation))
    return seen


async def test_a_lost_sim_execution_is_restored_to_the_same_screen_and_state() -> None:
    sim = SimGym(seed=0, screenshot_size=(160, 384))
    task = await _sim_task(sim)
    assert await gym_replays_exactly(sim)
    reference = await sim.start(task)
    expected = await _play(reference)
    first = await sim.start(task)
    execution = ReplayingExecution(sim, task, first, max_replays=1)
    seen = [observation_digest(await execution.observe())]
    for action in ACTIONS[:2]:
        result = await execution.act(action)
        assert result.observation is not None
        seen.append(observation_digest(result.observation))
    await first.close()  # the execution dies behind the episode's back
    result = await execution.act(ACTIONS[2])  # restored, then the action runs once
    assert result.observation is not None
    seen.append(observation_digest(result.observation))
    assert seen == expected
    assert execution.lost == [first.execution_id] and execution.execution_id != first.execution_id
    assert execution.replayed_actions == 2
    restored: Any = sim._live[execution.execution_id]
    assert restored.state == reference.state  # same phone, same turn, same app data
    evaluation = await execution.evaluate()
    assert evaluation == await reference.evaluate()
    await execution.close()
    await reference.close()
    assert not sim._live


class _SimBehind:
    """The real simulator behind a gym that declares exact replay; subclasses change how
    executions start."""

    def __init__(self) -> None:
        self.inner = SimGym(seed=0, screenshot_size=(160, 384))
        self.gym_id = "sim"

    async def replays_exactly(self) -> bool:
        return True

    async def list_tasks(self) -> list[Task]:
        return await self.inner.list_tasks()

    async def get_task(self, task_id: str) -> Task:
        return await self.inner.get_task(task_id)

    async def start(self, task: Task, options: dict[str, Any] | None = None) -> Execution:
        return await self.inner.start(task, options)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Drifting(_SimBehind):
    """Every start gets another phone (another seed): a gym that claims exact replay falsely."""

    def __init__(self) -> None:
        super().__init__()
        self.starts = 0

    async def start(self, task: Task, options: dict[str, Any] | None = None) -> Execution:
        self.starts += 1
        return await self.inner.start(task, {"seed": 1000 + self.starts})


async def test_a_replay_that_does_not_show_the_last_screen_is_refused() -> None:
    gym = _Drifting()
    task = await _sim_task(gym.inner)
    first = await gym.start(task)
    execution = ReplayingExecution(gym, task, first, max_replays=3)
    await execution.observe()
    await execution.act(ACTIONS[0])
    await first.close()
    with pytest.raises(RecoveryFailed, match="does not show the screen last seen"):
        await execution.observe()
    assert gym.starts == 2  # a mismatch is not retried: the gym does not replay exactly
    await execution.close()
    assert not gym.inner._live  # the refused copy is closed too


async def test_only_a_gym_that_declares_exact_replay_is_replayed(toy: Any) -> None:
    assert await gym_replays_exactly(SimGym(seed=0))
    assert not await gym_replays_exactly(toy)  # a real gym that does not say so
    assert not await gym_replays_exactly(object())


class _BlindActs(_SimBehind):
    """Actions answer without a screen (as a gym may): the screen last seen then comes from an
    ``observe`` between actions."""

    async def start(self, task: Task, options: dict[str, Any] | None = None) -> Execution:
        return _Blind(await self.inner.start(task, options))


class _Blind:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.execution_id = inner.execution_id
        self.task = inner.task

    async def observe(self) -> Any:
        return await self.inner.observe()

    async def act(self, action: Any) -> Any:
        result = await self.inner.act(action)
        return StepResult(ok=result.ok, error=result.error, feedback=result.feedback)

    async def evaluate(self, answer: str | None = None) -> Any:
        return await self.inner.evaluate(answer)

    async def close(self) -> None:
        await self.inner.close()


async def test_a_restore_checks_the_screen_seen_between_actions() -> None:
    gym = _BlindActs()
    task = await _sim_task(gym.inner)
    first = await gym.start(task)
    execution = ReplayingExecution(gym, task, first, max_replays=1)
    await execution.act(ACTIONS[0])
    await execution.act(ACTIONS[1])
    seen = observation_digest(await execution.observe())  # after two actions
    await execution.act(ACTIONS[2])  # no screen: the check stays at the second
    await first.close()
    now = await execution.observe()  # restored: three replayed, checked after the second
    assert execution.lost == [first.execution_id] and execution.replayed_actions == 3
    assert now.turn == 3 and observation_digest(now) != seen
    await execution.close()
    assert not gym.inner._live


async def test_restores_are_bounded() -> None:
    sim = SimGym(seed=0, screenshot_size=(160, 384))
    task = await _sim_task(sim)
    first = await sim.start(task)
    execution = ReplayingExecution(sim, task, first, max_replays=1)
    await execution.observe()
    await first.close()
    await execution.observe()  # the one restore
    assert len(execution.lost) == 1
    await sim._live[execution.execution_id].close()
    with pytest.raises(ExecutionGone):
        await execution.observe()
    await execution.close()


async def test_a_crashed_execution_over_http_is_restored_and_nothing_leaks(serve) -> None:
    """The server crashes the execution on an observation (502, then 404); the replaying
    execution starts a fresh one over HTTP, replays, checks the screen (PNG bytes from the
    server) and goes on; every execution is closed at the end."""
    share = {"observation": 0.5}
    fates = (False, True, False, False, False)
    seed = _seed_with_fates("observation", "crash", fates, crash_share=share)
    sim = SimGym(seed=0, screenshot_size=(160, 384))
    app = create_app({"sim": sim}, FaultProfile(seed=seed, crash_share=share))
    async with serve(app) as url:
        gym = HttpGym(url, "sim", retries=RETRY, timeouts=GENEROUS)
        assert await gym_replays_exactly(gym)
        task = await _sim_task(sim)
        first = await gym.start(task)
        execution = ReplayingExecution(gym, task, first, max_replays=2)
        try:
            before = observation_digest(await execution.observe())
            await execution.act(ACTIONS[0])
            after = observation_digest(await execution.observe())  # crashes, restored
            assert after != before
            assert execution.lost == [first.execution_id]
            state = app.state.gym_server
            assert state.crashed == [("sim", first.execution_id)]
            assert _live_sim(app, execution.execution_id).execution.state.turn == 1
        finally:
            await execution.close()
            await gym.aclose()
        assert gym.held_at_close == 0
    assert not app.state.gym_server.live


# ----------------------------------------------------------------- crash at arrival
async def test_a_crash_happens_when_the_request_arrives_never_after_its_stall(
    toy: Any, serve: Any
) -> None:
    """A request drawn to crash and to stall crashes at once (502, then 404 for the retry):
    the crash can never land after a retry of the same call was answered 200 (the damaged
    execution the first chaos run counted in a trained group,
    ``docs/contracts.md#recovery-at-the-call``)."""
    faults: dict[str, Any] = {
        "crash_share": {"evaluate": 1.0},
        "stall_share": {"evaluate": 0.5},
        "stall_s": 3600.0,
    }
    seed = _seed_with_fates("evaluate", "stall_s", (True, False, False), **faults)
    profile = FaultProfile(seed=seed, **faults)
    app = create_app({"toy": toy}, profile)
    async with serve(app) as url:
        gym = HttpGym(url, "toy", retries=RETRY, timeouts=GENEROUS)
        execution = await gym.start(Task(task_id="task-001"))
        try:
            with pytest.raises(ExecutionNotFound):  # within the limit: no 3600 s stall ran
                await asyncio.wait_for(execution.evaluate(), timeout=120)
        finally:
            await execution.close()
            await gym.aclose()
    assert app.state.gym_server.crashed == [("toy", execution.execution_id)]  # crashed once


async def test_a_create_whose_answer_was_lost_gives_the_same_execution(serve) -> None:
    """``drop_after`` on a create: the server created it, the answer was lost; the client's
    retry (same request id) gets that execution, and no second one is made."""
    share = {"create": 0.5}
    seed = _seed_with_fates("create", "drop_after", (True, False), drop_after_share=share)
    sim = SimGym(seed=0, screenshot_size=(160, 384))
    app = create_app({"sim": sim}, FaultProfile(seed=seed, drop_after_share=share))
    async with serve(app) as url:
        gym = HttpGym(url, "sim", retries=RETRY, timeouts=GENEROUS)
        execution = await gym.start(await _sim_task(sim))
        try:
            state = app.state.gym_server
            assert gym.call_stats.retries == 1
            assert [key for key in state.created] == [("sim", execution.execution_id)]
        finally:
            await execution.close()
            await gym.aclose()
        assert gym.held_at_close == 0
