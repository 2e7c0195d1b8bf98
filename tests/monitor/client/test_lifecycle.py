"""``TrainingMonitor``: one lifecycle for every path (end states, SIGTERM, dead runs, AReaL
stats → step columns, secrets kept out of the record)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from recorder_kit import make_context, make_task, run_episode_turns
from sqlalchemy import select

from cua_native.monitor.client.lifecycle import (
    LEDGER,
    Terminated,
    TrainingMonitor,
    areal_step_columns,
    handle_sigterm,
    new_run_name,
    redact,
)
from cua_native.monitor.client.recorder import Recorder
from cua_native.monitor.client.sinks import SinkUnavailable, SqlSink
from cua_native.monitor.db import schema
from cua_native.monitor.db.store import MonitorStore

FAST = {"flush_interval": 0.02, "backoff": (0.05, 0.2), "send_timeout": 120.0}
"""Short poll intervals; a send timeout no loaded machine reaches (these tests time nothing)."""


def areal_stats() -> dict[str, float]:
    """What AReaL 1.0.4's own ``stats_tracker`` exports for one PPO update, built with the
    same scopes and calls as ``PPOActor.ppo_update`` / ``FSDPEngine.train_batch``."""
    import torch
    from areal.utils import stats_tracker

    tracker = stats_tracker.DistributedStatsTracker()
    with tracker.scope("ppo_actor"):
        tracker.denominator(
            n_seqs=torch.ones(4, dtype=torch.bool), n_valid_tokens=torch.ones(10, dtype=torch.bool)
        )
        tracker.stat(task_reward=torch.tensor([1.0, 0.0, 1.0, 0.0]), denominator="n_seqs")
        with tracker.scope("update"):
            tracker.denominator(n_valid_tokens=torch.ones(10, dtype=torch.bool))
            tracker.stat(
                actor_loss=torch.full((10,), 0.25),
                approx_kl=torch.full((10,), 0.5),
                denominator="n_valid_tokens",
            )
            tracker.scalar(grad_norm=1.5, lr=0.125, update_successful=1.0)
    return tracker.export()


def test_areal_stat_names_map_to_step_columns() -> None:
    stats = areal_stats()
    assert "ppo_actor/update/actor_loss/avg" in stats  # the names the mapping reads
    columns = areal_step_columns(stats | {"broken": float("nan")})
    assert columns["loss"] == pytest.approx(0.25)
    assert columns["kl"] == pytest.approx(0.5)
    assert columns["grad_norm"] == 1.5 and columns["learning_rate"] == 0.125
    assert columns["reward_mean"] == 0.5
    assert (columns["num_tokens"], columns["num_trajectories"]) == (10, 4)
    assert "broken" not in columns["metrics"]
    assert columns["metrics"]["ppo_actor/update/lr"] == 0.125


def test_secrets_are_redacted_and_run_names_unique() -> None:
    config = {"cua": {"monitor_token": "s3cret", "db": {"password": "pw"}, "lr": 1}}
    assert redact(config) == {"cua": {"monitor_token": "***", "db": {"password": "***"}, "lr": 1}}
    assert new_run_name("exp_trial") != new_run_name("exp_trial")


def _training(store: MonitorStore) -> list[schema.Training]:
    with store.session() as session:
        return list(session.scalars(select(schema.Training).order_by(schema.Training.id)))


async def test_step_rows_carry_areal_stats_and_the_run_name(
    store: MonitorStore, tmp_path: Path
) -> None:
    recorder = Recorder(
        [SqlSink(store, owns_store=False)], run_dir=tmp_path / "run", run_name="exp_t_1", **FAST
    )
    monitor = TrainingMonitor(
        recorder,
        model_name="m",
        config={"token": "s3cret-xyz"},
        total_steps=2,
        experiment="exp",
        trial="t",
    )
    async with monitor:
        monitor.tasks([make_task("t1")])
        monitor.step_started(0)
        context = make_context(make_task("t1"))
        context.step = None  # a cluster rollout: the step comes from the weights version
        recorder.episode_started(context)
        monitor.step_training(0)
        monitor.step_finished(0, areal_stats(), metrics={"extra": 1.0})
    (training,) = _training(store)
    assert training.run_name == "exp_t_1" and training.status == "completed"
    assert "s3cret" not in (training.config_json or "") and "***" in (training.config_json or "")
    with store.session() as session:
        step = session.scalars(select(schema.Step)).one()
        rollout = session.scalars(select(schema.Rollout)).one()
    assert (step.loss, step.policy_gradient_norm, step.learning_rate) == (0.25, 1.5, 0.125)
    assert step.kl_divergence == 0.5 and step.num_tokens == 10
    assert json.loads(step.metrics_json or "{}")["extra"] == 1.0
    assert rollout.step_id == step.id
    assert monitor.report_undelivered() == []


@pytest.mark.parametrize(
    ("error", "status", "message"),
    [
        (RuntimeError("boom"), "failed", "RuntimeError: boom"),
        (KeyboardInterrupt(), "cancelled", "SIGINT"),
        (Terminated("SIGTERM"), "cancelled", "SIGTERM"),  # a KeyboardInterrupt, told apart
        (asyncio.CancelledError(), "cancelled", "cancelled"),
    ],
)
async def test_every_way_out_is_recorded(
    store: MonitorStore, tmp_path: Path, error: BaseException, status: str, message: str
) -> None:
    recorder = Recorder([SqlSink(store, owns_store=False)], run_dir=tmp_path / "run", **FAST)
    with pytest.raises(type(error)):
        async with TrainingMonitor(recorder, model_name="m"):
            recorder.step_started(0)
            raise error
    (training,) = _training(store)
    assert training.status == status and training.end_time is not None
    assert message in ((training.error_message or "") + (training.status_message or ""))
    with store.session() as session:
        assert session.scalars(select(schema.Step.status)).one() == "failed"


class FailsOnce:
    """The real ``SqlSink`` whose first delivery fails as a slow or restarting store does
    (``SinkUnavailable``: a send past its timeout, a locked database)."""

    def __init__(self, inner: SqlSink) -> None:
        self.inner = inner
        self.failed = asyncio.Event()
        for field in ("name", "address", "destination", "accepts_client_refs", "contract_only"):
            setattr(self, field, getattr(inner, field))

    async def send(self, batch: dict[str, Any]) -> dict[str, Any]:
        if not self.failed.is_set():
            self.failed.set()
            raise SinkUnavailable("no answer in 5.0s")
        return await self.inner.send(batch)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_the_end_is_delivered_after_a_failed_send(
    store: MonitorStore, tmp_path: Path
) -> None:
    """A send that failed during the run (under load: one past ``send_timeout``) leaves the
    channel waiting out its backoff when the run ends; the end of the run is still delivered
    at close, not left in the spill (``test_every_way_out_is_recorded`` failed this way)."""
    sink = FailsOnce(SqlSink(store, owns_store=False))
    recorder = Recorder(
        [sink],
        run_dir=tmp_path / "run",
        flush_interval=0.02,
        backoff=(3600.0, 3600.0),  # the retry would only come after the run: close must send
        send_timeout=120.0,
    )
    with pytest.raises(RuntimeError):
        async with TrainingMonitor(recorder, model_name="m"):
            recorder.step_started(0)
            await sink.failed.wait()  # the run's first rows failed to deliver
            raise RuntimeError("boom")
    (training,) = _training(store)
    assert training.status == "failed" and "RuntimeError: boom" in (training.error_message or "")
    with store.session() as session:
        assert session.scalars(select(schema.Step.status)).one() == "failed"
    assert recorder.undelivered() == []


async def test_sigterm_cancels_the_run_and_closes_what_is_open(
    store: MonitorStore, tmp_path: Path
) -> None:
    recorder = Recorder([SqlSink(store, owns_store=False)], run_dir=tmp_path / "run", **FAST)

    async def run() -> None:
        async with TrainingMonitor(recorder, model_name="m"):
            recorder.step_started(0)
            context = make_context(make_task("t1"))
            recorder.episode_started(context)
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.Event().wait()  # only the signal ends this

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(run())
    (training,) = _training(store)
    assert training.status == "cancelled" and "SIGTERM" in (training.status_message or "")
    with store.session() as session:
        assert session.scalars(select(schema.Step.status)).one() == "failed"
        assert session.scalars(select(schema.Rollout.status)).one() == "cancelled"
        assert session.scalars(select(schema.Environment.status)).one() == "terminated"


def test_sigterm_outside_a_loop_raises_terminated() -> None:
    from cua_native.monitor.client.lifecycle import Terminated

    with pytest.raises(Terminated), handle_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100_000_000):  # the handler raises at the next bytecode boundary
            pass
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_sigterm_that_a_ray_wait_turned_into_keyboardinterrupt_comes_out_as_terminated() -> None:
    """Ray's blocking calls end with a new, plain ``KeyboardInterrupt`` when the signal handler
    raised one (and swallow any other exception): ``handle_sigterm`` gives it its name back. A
    Ctrl-C stays a ``KeyboardInterrupt``."""

    def ray_get() -> None:  # what ray.get does with the handler's exception
        try:
            signal.raise_signal(signal.SIGTERM)
        except KeyboardInterrupt:
            raise KeyboardInterrupt from None

    with pytest.raises(Terminated) as info, handle_sigterm():
        ray_get()
    assert type(info.value.__cause__) is KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt) as plain, handle_sigterm():
        raise KeyboardInterrupt
    assert not isinstance(plain.value, Terminated)


async def test_a_killed_run_is_failed_by_the_next_and_never_mixed(
    store: MonitorStore, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    first = Recorder([SqlSink(store, owns_store=False)], run_dir=run_dir, run_name="r1", **FAST)
    await first.start()
    TrainingMonitor(first, model_name="m").start()
    first.step_started(0)
    first.episode_started(make_context(make_task("t1")))
    await first.aclose()  # what reached the store before the kill
    dead_pid = await asyncio.to_thread(_dead_pid)
    ledger = run_dir / LEDGER
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    lines[-1]["pid"] = dead_pid  # the process that wrote it is gone
    ledger.write_text("".join(json.dumps(line) + "\n" for line in lines))

    second = Recorder([SqlSink(store, owns_store=False)], run_dir=run_dir, run_name="r2", **FAST)
    async with TrainingMonitor(second, model_name="m"):
        second.step_started(0)
        context = make_context(make_task("t1"))
        second.episode_started(context)
        second.episode_finished(_finish(context))
    old, new = _training(store)
    assert (old.run_name, old.status) == ("r1", "failed") and "killed" in (old.error_message or "")
    assert (new.run_name, new.status) == ("r2", "completed")
    with store.session() as session:
        steps = {s.training_id: s for s in session.scalars(select(schema.Step))}
        assert steps[old.id].status == "failed"
        per_step = {
            s: len(session.scalars(select(schema.Rollout).where(schema.Rollout.step_id == s)).all())
            for s in (steps[old.id].id, steps[new.id].id)
        }
    assert list(per_step.values()) == [1, 1]


def _finish(context: Any) -> Any:
    from recorder_kit import finish

    return finish(context, run_episode_turns(context, 1))


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)
