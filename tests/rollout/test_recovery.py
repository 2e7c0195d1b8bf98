"""Recovery at the call inside an episode, on the real simulator, prompt builder and monitor
store: a lost execution is restored by replay and the episode completes (marked), never when
the switch is off or the gym does not declare exact replay; a model call that failed before
answering is sent again; an episode rejected at an action leaves rows a store accepts."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from sqlalchemy import select

from cua_native.actions.models import Answer, Click
from cua_native.engine.faults import EngineFaults, FaultyEngine
from cua_native.monitor.client.lifecycle import TrainingMonitor
from cua_native.monitor.client.recorder import Recorder
from cua_native.monitor.client.sinks import SqlSink
from cua_native.monitor.db import schema
from cua_native.monitor.db.store import MonitorStore
from cua_native.rollout.config import AgentConfig, RecoveryConfig
from cua_native.rollout.episode import run_with_retry
from cua_native.rollout.factories import make_agent
from cua_native.rollout.records import EpisodeContext, EpisodeObserver, NullObserver


def click_click_answer(turn: int) -> Any:
    return Click(x=0.5, y=0.3 + 0.2 * turn) if turn < 2 else Answer(text="done")


async def _run(
    gym: Any,
    engine: Any,
    config: AgentConfig,
    processor: Any,
    observer: EpisodeObserver | None = None,
) -> Any:
    agent = make_agent(config, processor)
    task = (await gym.list_tasks())[0]
    return await run_with_retry(
        gym=gym,
        task=task,
        engine=engine,
        agent=agent,
        make_context=lambda attempt: EpisodeContext(
            task=task, attempt=attempt, source="step", step=0, group_id="g0"
        ),
        observer=observer or NullObserver(),
    )


async def test_an_execution_lost_mid_episode_is_restored_and_the_episode_completes(
    processor: Any, scripted_engine_factory: Any, faulty_gym_factory: Any
) -> None:
    config = AgentConfig(max_turns=5, infra_retries=0)
    gym = faulty_gym_factory(crash={"act": {2}}, replays=True)
    engine = scripted_engine_factory(make_agent(config, processor).dialect, click_click_answer)
    run = await _run(gym, engine, config, processor)
    record = run.record
    assert record.outcome == "completed", record.reject_reason
    assert record.end_reason == "answer" and len(record.turns) == 3
    assert record.lost_executions == gym.crashed and len(gym.crashed) == 1
    assert record.context.execution_id not in gym.crashed  # it ended on the restored one
    assert record.replayed_actions == 1 and record.recovered_calls == 1
    assert all(turn.step is not None and turn.step.ok for turn in record.turns[:2])
    assert gym.counts["act"] == 4  # act 1, act 2 (lost), act 1 replayed, act 2 again
    assert gym.started == gym.closed == 2


async def _recorded_run(
    gym: Any, engine: Any, config: AgentConfig, processor: Any, store: Any, tmp_path: Path
) -> tuple[Any, Recorder]:
    """One episode as one training step records it: a real recorder into ``store``."""
    recorder = Recorder([SqlSink(store, owns_store=False)], run_dir=tmp_path / "run")
    async with recorder:
        with TrainingMonitor(recorder, model_name="m", total_steps=1):
            recorder.tasks_registered(await gym.list_tasks())
            recorder.step_started(0)
            run = await _run(gym, engine, config, processor, observer=recorder)
            recorder.step_finished(0)
    return run, recorder


async def test_the_monitor_row_of_a_recovered_episode_says_what_was_recovered(
    processor: Any, scripted_engine_factory: Any, faulty_gym_factory: Any, tmp_path: Path
) -> None:
    config = AgentConfig(max_turns=5, infra_retries=0)
    gym = faulty_gym_factory(crash={"act": {2}}, replays=True)
    engine = scripted_engine_factory(make_agent(config, processor).dialect, click_click_answer)
    store = MonitorStore.open(None, run_dir=tmp_path / "store")
    try:
        run, _ = await _recorded_run(gym, engine, config, processor, store, tmp_path)
        assert run.record.outcome == "completed"
        with store.session() as session:
            rollout = session.scalars(select(schema.Rollout)).one()
            summary = json.loads(rollout.summary_json)
        assert rollout.status == "completed"
        assert summary["lost_executions"] == gym.crashed and summary["recovered_calls"] == 1
        assert summary["replayed_actions"] == 1
        assert summary["execution_id"] == run.record.context.execution_id
    finally:
        store.close()


async def test_without_the_switch_or_the_capability_the_episode_is_rejected(
    processor: Any, scripted_engine_factory: Any, faulty_gym_factory: Any
) -> None:
    off = AgentConfig(max_turns=5, infra_retries=0, recovery=RecoveryConfig(replay=False))
    on = AgentConfig(max_turns=5, infra_retries=0)
    for config, replays in ((off, True), (on, False)):
        gym = faulty_gym_factory(crash={"act": {2}}, replays=replays)
        engine = scripted_engine_factory(make_agent(config, processor).dialect, click_click_answer)
        run = await _run(gym, engine, config, processor)
        assert run.rejected and run.record.reject_reason == "act"
        assert run.record.lost_executions == [] and gym.started == gym.closed == 1


def _engine_seed(fates: tuple[bool, ...], share: float) -> int:
    """The first seed whose first model calls restart exactly as ``fates`` says (the draws of
    ``FaultyEngine``: a stall draw, then a restart draw, per call)."""
    for seed in range(10_000):
        rng = random.Random(f"{seed}:engine")
        drawn = []
        for _ in fates:
            rng.random()
            drawn.append(rng.random() < share)
        if tuple(drawn) == fates:
            return seed
    raise AssertionError(f"no seed restarts as {fates}")


async def test_a_model_call_that_failed_before_answering_is_sent_again(
    processor: Any, scripted_engine_factory: Any, faulty_gym_factory: Any
) -> None:
    fates = (False, True, False, False)
    faults = EngineFaults(seed=_engine_seed(fates, 0.5), restart_share=0.5)
    recovery = RecoveryConfig(engine_backoff_s=0.0)
    config = AgentConfig(max_turns=5, infra_retries=0, recovery=recovery)
    gym = faulty_gym_factory()
    inner = scripted_engine_factory(make_agent(config, processor).dialect, click_click_answer)
    engine = FaultyEngine(inner, faults)
    run = await _run(gym, engine, config, processor)
    assert run.record.outcome == "completed", run.record.reject_reason
    assert engine.counts.restarts == 1 and engine.counts.calls == 4
    assert run.record.engine_retries == 1 and run.record.recovered_calls == 1
    assert [t.index for t in run.record.turns] == [0, 1, 2]

    none = AgentConfig(max_turns=5, infra_retries=0, recovery=RecoveryConfig(engine_retries=0))
    engine = FaultyEngine(inner, faults)
    run = await _run(faulty_gym_factory(), engine, none, processor)
    assert run.rejected and run.record.reject_reason == "generate"


async def test_an_episode_rejected_at_an_action_leaves_rows_the_store_accepts(
    processor: Any, scripted_engine_factory: Any, faulty_gym_factory: Any, tmp_path: Path
) -> None:
    """The turn whose action failed is in the record; the episode's end marks it done, so the
    store must hold it (before: "turns[…]: a new record needs turn", one row refused a run)."""
    config = AgentConfig(max_turns=5, infra_retries=0)
    gym = faulty_gym_factory(fail={"act": {2}})
    engine = scripted_engine_factory(make_agent(config, processor).dialect, click_click_answer)
    store = MonitorStore.open(None, run_dir=tmp_path / "store")
    try:
        run, recorder = await _recorded_run(gym, engine, config, processor, store, tmp_path)
        assert run.rejected and run.record.reject_reason == "act" and len(run.record.turns) == 2
        stats = recorder.stats()
        assert stats["monitor/sql/rejected"] == 0 and stats["monitor/dropped"] == 0
        with store.session() as session:
            rollout = session.scalars(select(schema.Rollout)).one()
            assert rollout.status == "failed"
            turns = session.scalars(select(schema.Turn).order_by(schema.Turn.turn)).all()
            assert [t.turn for t in turns] == [1, 2] and turns[-1].episode_done == 1
    finally:
        store.close()
