"""The episode loop and the group workflow on the real SimGym and prompt builder: endings,
parse-error feedback, infrastructure retries, group rejection, closes on every path."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from areal.utils import stats_tracker

from cua_native.actions.models import Answer, Click
from cua_native.gym.wire import evaluation_from_json
from cua_native.rollout.config import AgentConfig
from cua_native.rollout.cpu_pool import WORK_RANK
from cua_native.rollout.episode import run_episode, run_with_retry
from cua_native.rollout.factories import make_agent
from cua_native.rollout.records import EpisodeContext, NullObserver
from cua_native.rollout.workflow import CUAAgentWorkflow


class RecordingObserver:
    def __init__(self, explode: bool = False) -> None:
        self.events: list[str] = []
        self.explode = explode

    def episode_started(self, context: EpisodeContext) -> None:
        self.events.append("start")
        if self.explode:
            raise RuntimeError("observer down")

    def turn_finished(self, context: EpisodeContext, turn: Any) -> None:
        self.events.append(f"turn{turn.index}")
        if self.explode:
            raise RuntimeError("observer down")

    def episode_finished(self, record: Any) -> None:
        self.events.append("end")


def click_then_answer(turn: int) -> Any:
    return Click(x=0.5, y=0.5) if turn == 0 else Answer(text="done")


async def _first_task(gym: Any) -> Any:
    return (await gym.list_tasks())[0]


async def _episode(gym: Any, task: Any, engine: Any, agent: Any) -> Any:
    """One episode of ``task`` with no observer."""
    return await run_episode(
        gym=gym,
        task=task,
        engine=engine,
        agent=agent,
        context=EpisodeContext(task=task),
        observer=NullObserver(),
    )


async def test_answer_ends_episode_and_everything_is_recorded(
    processor, scripted_engine_factory, faulty_gym_factory
) -> None:
    config = AgentConfig(max_turns=5)
    agent = make_agent(config, processor)
    gym = faulty_gym_factory()
    engine = scripted_engine_factory(agent.dialect, click_then_answer)
    task = await _first_task(gym)
    observer = RecordingObserver(explode=True)  # observer errors never break the rollout
    run = await run_episode(
        gym=gym,
        task=task,
        engine=engine,
        agent=agent,
        context=EpisodeContext(task=task),
        observer=observer,
    )
    record = run.record
    assert record.outcome == "completed", record.reject_reason
    assert record.end_reason == "answer" and record.answer == "done"
    assert len(record.turns) == 2 and len(run.prompt_pixels) == 2
    assert record.turns[0].step is not None and record.turns[0].step.ok
    assert record.evaluation is not None and record.reward == record.evaluation.reward
    assert not any(t.token_mismatch for t in record.turns)
    assert {"create", "observe", "prompt", "generate", "parse", "act", "evaluate", "close"} <= set(
        record.timings
    )
    assert observer.events == ["start", "turn0", "turn1", "end"]
    assert (gym.started, gym.closed) == (1, 1)


async def test_parse_errors_are_fed_back_then_end_the_episode(
    processor, scripted_engine_factory, faulty_gym_factory
) -> None:
    config = AgentConfig(max_turns=10, max_consecutive_parse_errors=3, format_penalty=0.05)
    agent = make_agent(config, processor)
    gym = faulty_gym_factory()
    engine = scripted_engine_factory(agent.dialect, lambda turn: "I will not use a tool.")
    task = await _first_task(gym)
    run = await _episode(gym, task, engine, agent)
    record = run.record
    assert record.outcome == "completed"
    assert record.end_reason == "parse_errors" and len(record.turns) == 3
    assert sum(record.parse_errors.values()) == 3
    assert record.evaluation is not None
    assert record.reward == pytest.approx(record.evaluation.reward - 0.15)
    # The error went back to the model: later prompts are longer than the first.
    assert len(record.turns[1].prompt_ids) > len(record.turns[0].prompt_ids)
    assert gym.counts.get("act", 0) == 0 and (gym.started, gym.closed) == (1, 1)


async def test_max_turns_and_time_limit_are_agent_failures(
    processor, scripted_engine_factory, faulty_gym_factory
) -> None:
    gym = faulty_gym_factory()
    task = await _first_task(gym)
    agent = make_agent(AgentConfig(max_turns=2), processor)
    engine = scripted_engine_factory(agent.dialect, lambda turn: Click(x=0.2, y=0.3))
    run = await _episode(gym, task, engine, agent)
    assert (run.record.outcome, run.record.end_reason, len(run.record.turns)) == (
        "completed",
        "max_turns",
        2,
    )
    agent = make_agent(AgentConfig(max_turns=50, episode_timeout_s=0.3), processor)
    slow = scripted_engine_factory(agent.dialect, lambda turn: Click(x=0.2, y=0.3), latency=0.2)
    run = await _episode(gym, task, slow, agent)
    assert run.record.outcome == "completed" and run.record.end_reason == "time_limit"
    assert run.record.evaluation is not None
    assert gym.started == gym.closed == 2


async def test_infra_failure_is_retried_on_a_fresh_execution(
    processor, scripted_engine_factory, faulty_gym_factory
) -> None:
    agent = make_agent(AgentConfig(max_turns=3), processor)
    gym = faulty_gym_factory(fail={"observe": {1}})
    engine = scripted_engine_factory(agent.dialect, click_then_answer)
    task = await _first_task(gym)
    rejected: list[str | None] = []
    run = await run_with_retry(
        gym=gym,
        task=task,
        engine=engine,
        agent=agent,
        make_context=lambda attempt: EpisodeContext(task=task, attempt=attempt),
        observer=NullObserver(),
        on_reject=lambda r: rejected.append(r.record.reject_reason),
    )
    assert rejected == ["observe"]
    assert run.record.outcome == "completed" and run.record.context.attempt == 1
    assert (gym.started, gym.closed) == (2, 2)


@pytest.mark.parametrize("point", ["start", "act", "evaluate"])
async def test_group_is_rejected_when_the_retry_fails_too(
    point, processor, scripted_engine_factory, faulty_gym_factory
) -> None:
    config = AgentConfig(max_turns=3, group_size=3)
    gym = faulty_gym_factory(fail={point: None})
    workflow = CUAAgentWorkflow(config, gym=gym, processor=processor)
    engine = scripted_engine_factory(make_agent(config, processor).dialect, click_then_answer)
    task = await _first_task(gym)
    tracker = stats_tracker.get("rollout")
    tracker.export(reset=True)
    result = await workflow.arun_episode(engine, {"task": task.model_dump_json()})
    assert result is None
    assert gym.started == gym.closed
    stats = tracker.export(reset=True)
    reason = "create" if point == "start" else point
    assert stats[f"rollout/cua/rejected_groups/{reason}__count"] == 1
    assert stats[f"rollout/cua/rejected_episodes/{reason}__count"] >= 2


async def test_cancellation_closes_every_execution(
    processor, scripted_engine_factory, faulty_gym_factory
) -> None:
    config = AgentConfig(max_turns=3, group_size=4)
    gym = faulty_gym_factory(hang={"act"})
    workflow = CUAAgentWorkflow(config, gym=gym, processor=processor)
    engine = scripted_engine_factory(make_agent(config, processor).dialect, click_then_answer)
    task = await _first_task(gym)
    running = asyncio.create_task(workflow.arun_episode(engine, {"task": task.model_dump_json()}))
    for _ in range(12_000):  # bounded polling, generous under load (up to ~2 min)
        if gym.counts.get("act", 0) == 4:
            break
        await asyncio.sleep(0.01)
    assert gym.counts.get("act", 0) == 4
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert gym.started == gym.closed == 4


async def test_workflow_group_rows_and_stats(
    processor, scripted_engine_factory, faulty_gym_factory
) -> None:
    config = AgentConfig(max_turns=3, group_size=2, turn_discount=0.5)
    gym = faulty_gym_factory()
    workflow = CUAAgentWorkflow(config, gym=gym, processor=processor)
    engine = scripted_engine_factory(make_agent(config, processor).dialect, click_then_answer)
    task = await _first_task(gym)
    tracker = stats_tracker.get("rollout")
    tracker.export(reset=True)
    out = await workflow.arun_episode(engine, {"task": task.model_dump_json()})
    assert out is not None
    assert out["input_ids"].shape[0] == 4  # 2 episodes x 2 turns, one row per turn
    assert len(out["multi_modal_input"]) == 4
    trained = out["loss_mask"].bool()
    assert trained.any() and (out["logprobs"][trained] == -0.5).all()
    prompt = out["attention_mask"].bool() & ~trained
    assert (out["versions"][prompt] == -1).all() and (out["logprobs"][prompt] == 0).all()
    stats = tracker.export(reset=True)
    assert stats["rollout/cua/turns"] == 2.0 and stats["rollout/cua/turns__count"] == 2
    assert "rollout/cua/time/generate" in stats and "rollout/cua/parse_errors/format" in stats
    assert gym.started == gym.closed == 2


async def test_a_uniform_group_is_found_before_its_rows_are_built(
    processor, scripted_engine_factory, faulty_gym_factory, monkeypatch
) -> None:
    """Two episodes that act alike earn one reward: a uniform group. Skipped, it gives no rows
    and its pixel rows are never built; kept, it gives its rows and still says it is uniform."""
    import cua_native.rollout.workflow as workflow_module

    config = AgentConfig(max_turns=3, group_size=2)
    gym = faulty_gym_factory()
    engine = scripted_engine_factory(make_agent(config, processor).dialect, click_then_answer)
    row = {"task": (await _first_task(gym)).model_dump_json()}
    tracker = stats_tracker.get("rollout")
    tracker.export(reset=True)
    built = workflow_module.group_samples

    def no_rows(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a skipped uniform group's rows were built")

    monkeypatch.setattr(workflow_module, "group_samples", no_rows)
    skipping = CUAAgentWorkflow(config, gym=gym, processor=processor, skip_uniform_groups=True)
    skipped = await skipping.arun_group(engine, row)
    assert (skipped.samples, skipped.uniform, skipped.rejected) == (None, True, False)
    assert tracker.export(reset=True)["rollout/cua/uniform_groups"] == 1.0
    monkeypatch.setattr(workflow_module, "group_samples", built)
    kept = await CUAAgentWorkflow(config, gym=gym, processor=processor).arun_group(engine, row)
    assert kept.uniform and not kept.rejected and kept.samples is not None
    assert not bool(kept.samples["rewards"].abs().max() > 1e-6)  # every row's reward is 0
    assert gym.started == gym.closed == 4


async def test_episode_work_is_ranked_by_turn_and_start_time(
    processor, scripted_engine_factory, faulty_gym_factory
) -> None:
    """Every gym call of an episode runs under ``WORK_RANK = (turn, start time)``, the order the
    CPU pool serves work in; the caller's rank is restored afterwards."""
    agent = make_agent(AgentConfig(max_turns=3), processor)
    gym = faulty_gym_factory()
    seen: list[tuple[str, Any]] = []
    check = gym.check

    async def recording(call: str) -> None:
        seen.append((call, WORK_RANK.get()))
        await check(call)

    gym.check = recording
    engine = scripted_engine_factory(agent.dialect, lambda turn: Click(x=0.5, y=0.5))
    task = await _first_task(gym)
    run = await _episode(gym, task, engine, agent)
    assert run.record.end_reason == "max_turns"
    assert WORK_RANK.get() is None
    assert len({rank[1] for _, rank in seen}) == 1  # one start time
    assert [(call, rank[0]) for call, rank in seen] == [
        ("start", 0),
        ("observe", 0),  # later screens come with the act (the simulator renders them)
        ("act", 0),
        ("act", 1),
        ("act", 2),
        ("evaluate", 2),
    ]


async def test_non_finite_reward_rejects_the_episode_as_bad_reward(
    processor, scripted_engine_factory, faulty_gym_factory
) -> None:
    """A gym answering ``"score": 1e999`` (read by the real wire decoder as inf) is an
    infrastructure failure: the episode is rejected, never a success with reward inf."""
    answer = json.loads('{"success": true, "result": {"score": 1e999, "success": true}}')
    config = AgentConfig(max_turns=5, infra_retries=1)
    agent = make_agent(config, processor)
    gym = faulty_gym_factory()

    async def broken_evaluate(answer_text: str | None = None) -> Any:
        return evaluation_from_json(answer)

    real_start = gym.start

    async def start(task: Any, options: Any = None) -> Any:
        execution = await real_start(task, options)
        execution.evaluate = broken_evaluate
        return execution

    gym.start = start
    engine = scripted_engine_factory(agent.dialect, click_then_answer)
    task = await _first_task(gym)
    rejected: list[str | None] = []
    run = await run_with_retry(
        gym=gym,
        task=task,
        engine=engine,
        agent=agent,
        make_context=lambda attempt: EpisodeContext(task=task, attempt=attempt),
        observer=NullObserver(),
        on_reject=lambda r: rejected.append(r.record.reject_reason),
    )
    assert evaluation_from_json(answer).reward == float("inf")
    assert run.rejected and run.record.reject_reason == "bad_reward"
    assert rejected == ["bad_reward", "bad_reward"]
    assert (gym.started, gym.closed) == (2, 2)


async def test_a_group_cancelled_while_creating_ends_after_closing_what_came(
    processor, scripted_engine_factory, faulty_gym_factory
) -> None:
    """Cancelled while its executions are being created, a group waits for the creations and
    closes them before its cancellation ends (no environment left behind to a callback)."""
    config = AgentConfig(max_turns=3, group_size=3)
    gym = faulty_gym_factory()
    gate = asyncio.Event()
    waiting: list[int] = []
    create = gym.start

    async def gated_start(task: Any, options: Any = None) -> Any:
        waiting.append(1)
        await gate.wait()
        return await create(task, options)

    gym.start = gated_start  # type: ignore[method-assign]
    workflow = CUAAgentWorkflow(config, gym=gym, processor=processor)
    engine = scripted_engine_factory(make_agent(config, processor).dialect, click_then_answer)
    task = await _first_task(gym)
    running = asyncio.create_task(workflow.arun_episode(engine, {"task": task.model_dump_json()}))
    for _ in range(10_000):  # loop turns, not time: until all three creations wait
        if len(waiting) == 3:
            break
        await asyncio.sleep(0)
    assert len(waiting) == 3
    running.cancel()
    for _ in range(200):
        await asyncio.sleep(0)
    assert not running.done()  # still waiting for the creations it will close
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert gym.started == gym.closed == 3
