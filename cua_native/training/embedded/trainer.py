"""The embedded trainer: GRPO on one machine, with AReaL's own PPO code.

Per step: the workflow runs ``group_size`` episodes on each of ``batch_size`` tasks against the
in-process engine; AReaL's ``PPOActor`` (on ``LocalTrainEngine``) recomputes log-probs,
computes advantages and runs the GRPO update; the new weights go to the engine in memory and
its version is bumped, so the next step's tokens carry the new version. A baseline evaluation
runs before training and an evaluation every ``cua.eval_every`` steps (each
``cua.eval_episodes_per_task`` episodes per eval task), all recorded in the monitor database
under the run directory. Weights are saved every ``saver.freq_steps`` steps (AReaL's field) and
at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cua_native.config import LoadedConfig
from cua_native.gym.protocol import Gym, Task
from cua_native.monitor.client.lifecycle import redact
from cua_native.rollout.records import (
    EpisodeObserver,
    EpisodeRecord,
    EpisodeTally,
    FanoutObserver,
    NullObserver,
)
from cua_native.rollout.runtime import freeze_startup_heap
from cua_native.training.embedded.evaluation import (
    EvalKind,
    EvalResult,
    Evaluation,
    evaluation_for,
)
from cua_native.training.embedded.task_order import TaskOrder

if TYPE_CHECKING:  # torch, transformers and AReaL: imported when the run starts
    from areal.trainer.ppo.actor import PPOActor
    from tqdm import tqdm
    from transformers import ProcessorMixin

    from cua_native.engine import InProcessEngine
    from cua_native.monitor.client.lifecycle import TrainingMonitor
    from cua_native.rollout.workflow import CUAAgentWorkflow, GroupOutcome
    from cua_native.training.local_engine import LocalTrainEngine

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class StepSummary:
    step: int
    episodes: int
    rejected_groups: int
    success_rate: float
    reward_mean: float
    reward_std: float
    turns_mean: float
    samples: int
    uniform_groups: int = 0
    """Uniform groups: their episodes all earned the same reward, so they carry no GRPO signal;
    with ``cua.skip_uniform_groups`` they are left out of the update."""
    loss: float | None = None
    grad_norm: float | None = None
    seconds: float = 0.0
    logp_gap: float | None = None
    """Mean |engine log-prob - trainer's recomputed log-prob| over the step's output tokens:
    near 0 when sampler and trainer see the same sequence under the same temperature."""
    adv_abs: float | None = None
    """Mean |advantage| over the step's output tokens (0 when every group had equal rewards)."""
    rollout_seconds: float = 0.0
    """Seconds the step's rollouts took: what a trainer on its own GPU would idle waiting."""
    rejected_episodes: int = 0
    """Episodes an infrastructure fault rejected (each retried on a fresh execution, or its
    group dropped): never trained on."""
    retries: int = 0
    """Gym calls the client retried (5xx, dropped connections, timeouts of safe calls, 429)."""
    retry_wait_s: float = 0.0
    """Seconds lost to those retries: the waits before them (``Retry-After``, backoff) and the
    failed attempts they repeat (a stalled call's whole timeout), summed over concurrent
    calls."""
    rejected_s: float = 0.0
    """Seconds the rejected episodes ran before they were rejected (summed over episodes)."""
    reject_reasons: dict[str, int] = field(default_factory=dict)
    """The rejected episodes by reason."""
    restored: int = 0
    """Executions lost and restored by exact replay (``gym/recovery.py``)."""
    engine_retries: int = 0
    """Model calls sent again after failing before an answer."""
    recovery_s: float = 0.0
    """Seconds spent restoring executions and waiting before model retries."""
    recovered_episodes: int = 0
    """Completed episodes that recovered at least one call."""

    @property
    def recovered_calls(self) -> int:
        return self.restored + self.engine_retries

    @property
    def wait_s(self) -> float:
        """Seconds lost waiting on faults: before gym retries, before model retries, restoring
        executions (summed over concurrent calls)."""
        return self.retry_wait_s + self.recovery_s

    @property
    def rollout_share(self) -> float:
        """Share of the step's time spent waiting for rollouts."""
        return self.rollout_seconds / self.seconds if self.seconds > 0 else 0.0

    groups: int = 0
    """Groups played (dynamic sampling's extra rounds included)."""
    env_steps: int = 0
    """Environment steps played: model turns of every played episode, siblings included."""
    root_success: float = 0.0
    """Success of the played root episodes (what plain GRPO plays; siblings and replays not)."""
    branch_points: int = 0
    extra_env_steps: int = 0
    """The branching budget spent: turns played by forked siblings."""
    signal_groups: int = 0
    """Groups trained on whose advantages are not all 0."""
    replayed_samples: int = 0
    """Rows of replayed successes in the update."""

    def table_row(self, credit: bool = False) -> str:
        """This step as a row under ``step_table_header(credit)``."""
        loss = f"{self.loss:8.4f}" if self.loss is not None else f"{'-':>8}"
        adv = f"{self.adv_abs:6.3f}" if self.adv_abs is not None else f"{'-':>6}"
        gap = f"{self.logp_gap:7.1e}" if self.logp_gap is not None else f"{'-':>7}"
        grad = f"{self.grad_norm:7.3f}" if self.grad_norm is not None else f"{'-':>7}"
        return (
            f"{self.step:>4} {self.episodes:>8} {self.success_rate:>8.0%} "
            f"{self.reward_mean:>8.3f} {self.reward_std:>6.3f} {self.turns_mean:>6.1f} "
            f"{self.samples:>7} {self.uniform_groups:>7} {loss} {adv} {gap} {grad} "
            f"{self.seconds:>6.1f} {self.rollout_share:>5.0%} {self.rejected_episodes:>4} "
            f"{self.rejected_groups:>4} {self.retries:>5} {self.recovered_calls:>4} "
            f"{self.wait_s:>5.0f}"
        ) + (
            f" {self.branch_points:>6} {self.extra_env_steps:>6} {self.env_steps:>6} "
            f"{self.signal_groups:>3}/{self.groups:<3} {self.replayed_samples:>6}"
            if credit
            else ""
        )


CREDIT_COLUMNS = f" {'branch':>6} {'+env':>6} {'env':>6} {'signal':>7} {'replay':>6}"
"""Columns added when a credit switch is on: branch points, the siblings' extra environment
steps, all environment steps, groups with signal / groups played, replayed rows."""


def step_table_header(credit: bool = False) -> str:
    """The step table's header, with ``CREDIT_COLUMNS`` when a credit switch is on."""
    return STEP_TABLE_HEADER + (CREDIT_COLUMNS if credit else "")


STEP_TABLE_HEADER = (
    f"{'step':>4} {'episodes':>8} {'success':>8} {'reward':>8} {'±':>6} {'turns':>6} "
    f"{'samples':>7} {'uniform':>7} {'loss':>8} {'|adv|':>6} {'logp Δ':>7} {'|grad|':>7} {'sec':>6}"
    f" {'roll':>5} {'rej':>4} {'drop':>4} {'retry':>5} {'rcv':>4} {'wait':>5}"
)
"""Columns of the step table: what ``print_report`` prints at the end of a run and, without
progress bars, the trainer prints as each step finishes. ``roll``: the share of the step spent
waiting for rollouts; ``rej``: episodes an infrastructure fault rejected; ``drop``: groups
dropped for it; ``retry``: gym calls retried; ``rcv``: calls recovered at the call (executions
restored by replay, model calls sent again); ``wait``: seconds lost waiting on them (before gym
retries and in the failed attempts they repeat, before model retries, restoring; summed over
concurrent episodes)."""


@dataclass(slots=True)
class TrainReport:
    run_dir: Path
    model_dir: Path
    monitor_url: str | None
    steps: list[StepSummary] = field(default_factory=list)
    checkpoint: Path | None = None
    warm_start: dict[str, Any] | None = None
    evaluations: dict[int, EvalResult] = field(default_factory=dict)
    """Evaluation step (-1: the baseline) → its result: the run's one record of its evaluations."""
    credit: bool = False
    """A credit switch was on (the step table shows its columns)."""

    @property
    def baseline(self) -> EvalResult | None:
        """The evaluation before training (``None`` when the run made none)."""
        return self.evaluations.get(-1)

    @property
    def after_steps(self) -> dict[int, EvalResult]:
        """The evaluations after training steps, by step, in step order."""
        return {step: r for step, r in sorted(self.evaluations.items()) if step >= 0}


def _ppo_step(
    actor: PPOActor, batch: list[dict[str, Any]], ref: LocalTrainEngine | None = None
) -> dict[str, float]:
    """AReaL's order of operations in ``PPOTrainer.train``: recompute log-probs (the proximal
    policy), the reference's log-probs when ``ref`` is given (``actor.kl_ctl`` > 0: AReaL adds
    ``-kl_ctl * KL`` to each token's reward), advantages, update. Runs in a worker thread: it
    is the heavy part of a step."""
    import torch
    from areal.utils import stats_tracker

    if ref is not None:
        for traj in batch:
            traj["ref_logp"] = ref.forward_batch(traj)
    gaps: list[torch.Tensor] = []
    if actor.config.should_compute_prox_logp():
        for traj, logp in zip(batch, actor.compute_logp(batch), strict=True):
            traj["prox_logp"] = logp
            # AReaL's layout: the engine's log-prob of token t sits at t, the trainer's at t-1.
            mask = torch.roll(traj["loss_mask"].bool(), -1, -1)
            engine_logp = torch.roll(traj["logprobs"], -1, -1)
            gaps.append((engine_logp - logp)[mask].abs())
    advantages = actor.compute_advantages(batch)
    adv = torch.cat([a["advantages"][a["loss_mask"].bool()].abs() for a in advantages])
    actor.ppo_update(advantages)
    actor.engine.lr_scheduler_step()
    stats: dict[str, float] = stats_tracker.export_all()
    if gaps:
        stats["cua/logp_gap/avg"] = float(torch.cat(gaps).mean())
    stats["cua/adv_abs/avg"] = float(adv.mean()) if adv.numel() else 0.0
    return stats


def _version_dir(trainer: LocalTrainEngine) -> str:
    """The checkpoint directory name of the trainer's current weights."""
    return f"version-{trainer.get_version()}"


def _eval_due(every: int, step: int, total_steps: int) -> bool:
    """Evaluate every ``every`` steps and after the last step (so the final model is always
    measured); never when ``every`` is 0."""
    return every > 0 and ((step + 1) % every == 0 or step + 1 == total_steps)


@dataclass(slots=True)
class RejectedTime(NullObserver):
    """An episode observer summing the seconds of the rejected episodes (their phases' time)."""

    seconds: float = 0.0

    def episode_finished(self, record: EpisodeRecord) -> None:
        if record.outcome == "rejected":
            self.seconds += sum(record.timings.values())


def _call_stats(gym: Gym) -> tuple[int, float]:
    """The gym client's retries and the seconds lost to them so far: the waits before them and
    the failed attempts they repeat (0 for gyms that keep none)."""
    stats = getattr(gym, "call_stats", None)
    if stats is None:
        return 0, 0.0
    return int(stats.retries), float(stats.wait_s) + float(getattr(stats, "failed_s", 0.0))


def _keep_eval(report: TrainReport, result: EvalResult) -> None:
    """An evaluation's figures in the report, under its step (the baseline: -1)."""
    report.evaluations[-1 if result.kind == "baseline" else result.step] = result


def _pick(stats: dict[str, float], suffix: str) -> float | None:
    for key, value in stats.items():
        if key.endswith(suffix):
            return float(value)
    return None


@dataclass(slots=True)
class Policy:
    """The policy in its two forms: the inference engine that plays the episodes and the
    trainer's copy that AReaL's ``PPOActor`` updates (and, with ``actor.kl_ctl`` > 0, the frozen
    starting policy AReaL's KL reward is measured against)."""

    engine: InProcessEngine
    trainer: LocalTrainEngine
    actor: PPOActor
    processor: ProcessorMixin
    ref: LocalTrainEngine | None = None


@dataclass(slots=True)
class Session:
    """What the steps of one run share: the policy, the gym, the monitor and the one
    evaluation."""

    policy: Policy
    gym: Gym
    monitor: TrainingMonitor
    train_tasks: list[Task]
    evaluation: Evaluation
    """Its ``tasks`` are the run's eval tasks (``cua.eval_tasks``)."""
    task_row: Callable[[Task], dict[str, Any]]


class EmbeddedTrainer:
    """Owns the engines, the gym and the monitor for one embedded training run."""

    def __init__(
        self,
        loaded: LoadedConfig,
        *,
        progress: bool = True,
        engine_wrapper: Callable[[Any], Any] | None = None,
        observers: Sequence[EpisodeObserver] = (),
    ) -> None:
        """``engine_wrapper`` wraps the in-process engine before any rollout uses it (the
        chaos bench's inference faults, ``cua_native.engine.faults``); ``observers`` get every
        episode's events besides the monitor's recorder."""
        self.loaded = loaded
        self.progress = progress
        self.engine_wrapper = engine_wrapper
        self.observers = tuple(observers)
        self.run_dir = Path(loaded.cua.run_dir)
        self.rng = random.Random(loaded.areal.seed)
        from cua_native.rollout.replay import ReplayBuffer

        replay = loaded.cua.agent.credit.replay
        self.replay = ReplayBuffer(replay) if replay.enabled else None
        """The run's success buffer (``cua.agent.credit.replay``), kept across steps."""

    # ------------------------------------------------------------------ set-up
    async def _tasks(self, gym: Gym) -> tuple[list[Task], list[Task]]:
        from cua_native.rollout.dataset import load_tasks

        cua = self.loaded.cua
        train = await load_tasks(cua.tasks, gym)
        evals = await load_tasks(cua.eval_tasks, gym) if cua.eval_tasks is not None else []
        if not train:
            raise ValueError("cua.tasks selected no tasks; loosen its filters")
        return train, evals

    async def _load_policy(self, model_dir: Path, engine: InProcessEngine) -> Policy:
        """The trainer's copy of the model at ``model_dir`` beside the inference ``engine``."""
        import torch
        from areal.trainer.ppo.actor import PPOActor
        from transformers import AutoModelForImageTextToText

        from cua_native.rollout.factories import load_processor
        from cua_native.training.local_engine import LocalTrainEngine

        areal, cua = self.loaded.areal, self.loaded.cua
        processor = await asyncio.to_thread(load_processor, model_dir)
        model = await asyncio.to_thread(
            AutoModelForImageTextToText.from_pretrained, model_dir, dtype=torch.float32
        )
        optim = areal.actor.optimizer
        trainer = LocalTrainEngine(
            model,
            lr=optim.lr,
            weight_decay=optim.weight_decay,
            grad_clip=optim.gradient_clipping,
            temperature=areal.actor.temperature,
            device=cua.device,
            processor=processor,
            optimizer=optim.type,
            betas=(optim.beta1, optim.beta2),
            eps=optim.eps,
        )
        ref = None
        if areal.actor.kl_ctl > 0:  # the frozen starting policy, for AReaL's KL reward
            ref = LocalTrainEngine(
                copy.deepcopy(model).eval(), temperature=areal.actor.temperature, device=cua.device
            )
        return Policy(engine, trainer, PPOActor(areal.actor, trainer), processor, ref)

    def _monitor(self, model_dir: Path) -> TrainingMonitor:
        from cua_native.monitor.client.lifecycle import TrainingMonitor, new_run_name
        from cua_native.monitor.client.recorder import recorder_from_config

        areal, cua = self.loaded.areal, self.loaded.cua
        recorder = recorder_from_config(
            cua.monitor_db_url(),
            cua.monitor_url,
            cua.monitor_token,
            self.run_dir,
            model_path=str(model_dir),
            run_name=new_run_name(f"{areal.experiment_name}_{areal.trial_name}"),
        )
        return TrainingMonitor(
            recorder,
            model_name=str(model_dir),
            config={"cua": cua.model_dump(mode="json")},
            log_path=str(self.run_dir),
            experiment=areal.experiment_name,
            trial=areal.trial_name,
        )

    # ------------------------------------------------------------------ the run
    async def run(self) -> TrainReport:
        """Prepare the model (warm start), load the policy, then train under the monitor; the
        gym, the workflow and the inference engine are released on every path."""
        from cua_native.rollout.dataset import task_row
        from cua_native.rollout.factories import make_gym
        from cua_native.training.embedded.model import load_inference_engine, prepare_model

        cua = self.loaded.cua
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(
            json.dumps(redact({"cua": cua.model_dump(mode="json")}), indent=2)
        )
        start = await asyncio.to_thread(prepare_model, self.loaded, progress=self.progress)
        report = TrainReport(
            run_dir=self.run_dir,
            model_dir=start.path,
            monitor_url=cua.monitor_db_url(),
            warm_start=start.warm_start,
        )
        async with contextlib.AsyncExitStack() as cleanup:
            engine = await load_inference_engine(self.loaded, start.path)
            cleanup.push_async_callback(asyncio.to_thread, engine.destroy)
            if self.engine_wrapper is not None:
                engine = self.engine_wrapper(engine)
            policy = await self._load_policy(start.path, engine)
            gym = make_gym(cua.agent.gym)
            cleanup.push_async_callback(gym.aclose)
            monitor = self._monitor(start.path)
            freeze_startup_heap()
            await cleanup.enter_async_context(monitor)
            train_tasks, eval_tasks = await self._tasks(gym)
            session = Session(
                policy=policy,
                gym=gym,
                monitor=monitor,
                train_tasks=train_tasks,
                evaluation=evaluation_for(
                    self.loaded, eval_tasks, gym=gym, processor=policy.processor, monitor=monitor
                ),
                task_row=functools.partial(task_row, gym_id=gym.gym_id),
            )
            await self._train(session, report)
        return report

    async def _train(self, session: Session, report: TrainReport) -> None:
        """The baseline, then one step after another, each followed by its checkpoint (when
        due), its record and its evaluation (when due); a final checkpoint."""
        from tqdm import tqdm

        areal, cua = self.loaded.areal, self.loaded.cua
        train_tasks, eval_tasks = session.train_tasks, session.evaluation.tasks
        total_steps = areal.total_train_steps or max(
            1, len(train_tasks) // areal.train_dataset.batch_size
        )
        self._schedule(session, total_steps)
        # A task played under several gym seeds is one task to the monitor.
        session.monitor.tasks(list({t.task_id: t for t in train_tasks + eval_tasks}.values()))
        if cua.baseline and eval_tasks:
            await self._evaluate(session, report, "baseline", 0)
        batch_size = min(areal.train_dataset.batch_size, len(train_tasks))
        order = TaskOrder(train_tasks, self.rng)
        bar = tqdm(range(total_steps), desc="train", unit="step", disable=not self.progress)
        credit = cua.agent.credit
        report.credit = credit.any
        self._log(step_table_header(credit.any))
        for step in bar:
            started = time.perf_counter()
            summary, stats = await self._step(session, step, order, batch_size)
            checkpoint = None
            if areal.saver.freq_steps and (step + 1) % areal.saver.freq_steps == 0:
                checkpoint = report.checkpoint = await self._save(session.policy)
            summary.seconds = time.perf_counter() - started
            report.steps.append(summary)
            self._record_step(session.monitor, summary, stats, checkpoint)
            self._show_step(bar, summary)
            if eval_tasks and _eval_due(cua.eval_every, step, total_steps):
                await self._evaluate(session, report, "eval", step)
        trainer = session.policy.trainer
        if report.checkpoint is None or report.checkpoint.name != _version_dir(trainer):
            report.checkpoint = await self._save(session.policy)

    def _schedule(self, session: Session, total_steps: int) -> None:
        """The learning-rate schedule over ``total_steps``, and the monitor's step count."""
        optim = self.loaded.areal.actor.optimizer
        session.policy.trainer.schedule_lr(
            optim.lr_scheduler_type,
            total_steps,
            warmup_proportion=optim.warmup_steps_proportion,
            min_lr_ratio=optim.min_lr_ratio,
        )
        session.monitor.total_steps = total_steps

    # ------------------------------------------------------------------ one step
    async def _step(
        self, session: Session, step: int, order: TaskOrder, batch_size: int
    ) -> tuple[StepSummary, dict[str, float]]:
        """Play one group per task of the order's next batch (with ``credit.dynamic_sampling``,
        replacement groups for those without signal); update the policy on the groups that have
        rows (AReaL's PPO step) and hand the new weights to the inference engine."""
        from cua_native.rollout.workflow import CUAAgentWorkflow

        cua = self.loaded.cua
        credit = cua.agent.credit
        session.monitor.step_started(step)
        started = time.perf_counter()
        tally, lost = EpisodeTally(), RejectedTime()
        calls = _call_stats(session.gym)
        drop = cua.skip_uniform_groups or credit.dynamic_sampling
        workflow = CUAAgentWorkflow(
            cua.agent,
            source="step",
            gym=session.gym,
            processor=session.policy.processor,
            observer=FanoutObserver(session.monitor.recorder, tally, lost, *self.observers),
            skip_uniform_groups=drop,
            replay=self.replay,
        )
        try:
            groups = await self._play_step(
                workflow, session, order.next_batch(batch_size), order, step
            )
        finally:
            await workflow.aclose()
        rollout_seconds = time.perf_counter() - started
        calls_after = _call_stats(session.gym)
        played = [group for group in groups if group.samples is not None]
        trained = [group for group in played if not (drop and group.flat)]
        batch = [group.samples for group in trained if group.samples is not None]
        roots = [ok for group in groups for ok in group.root_successes]
        summary = StepSummary(
            step=step,
            episodes=tally.completed,
            rejected_groups=sum(group.rejected for group in groups),
            uniform_groups=sum(group.flat for group in groups),
            success_rate=tally.success_rate,
            reward_mean=tally.reward_mean,
            reward_std=tally.reward_std,
            turns_mean=tally.turns_mean,
            samples=sum(int(rows["input_ids"].shape[0]) for rows in batch),
            rollout_seconds=rollout_seconds,
            rejected_episodes=tally.rejected,
            reject_reasons=dict(tally.reject_reasons),
            retries=calls_after[0] - calls[0],
            retry_wait_s=calls_after[1] - calls[1],
            rejected_s=lost.seconds,
            restored=tally.restored,
            engine_retries=tally.engine_retries,
            recovery_s=tally.recovery_s,
            recovered_episodes=tally.recovered_episodes,
            groups=len(groups),
            env_steps=sum(group.env_steps for group in groups),
            root_success=sum(roots) / len(roots) if roots else 0.0,
            branch_points=sum(group.branch.points for group in groups),
            extra_env_steps=sum(group.branch.extra_turns for group in groups),
            signal_groups=sum(not group.flat for group in played),
            replayed_samples=sum(group.replayed_rows for group in trained),
        )
        stats: dict[str, float] = {}
        if batch:
            session.monitor.step_training(step)
            stats = await self._update(session.policy, batch)
            summary.loss = _pick(stats, "actor_loss/avg")
            summary.grad_norm = _pick(stats, "grad_norm")
            summary.logp_gap = stats.get("cua/logp_gap/avg")
            summary.adv_abs = stats.get("cua/adv_abs/avg")
        return summary, stats

    async def _update(self, policy: Policy, batch: list[dict[str, Any]]) -> dict[str, float]:
        """AReaL's PPO step in a worker thread, then the new weights (next version) in the
        inference engine: the next step's tokens carry that version."""
        stats = await asyncio.to_thread(_ppo_step, policy.actor, batch, policy.ref)
        version = policy.trainer.get_version() + 1
        policy.trainer.set_version(version)
        await asyncio.wrap_future(
            policy.engine.update_weights_from_state_dict(policy.trainer.state_dict(), version)
        )
        return stats

    def _record_step(
        self,
        monitor: TrainingMonitor,
        summary: StepSummary,
        stats: dict[str, float],
        checkpoint: Path | None,
    ) -> None:
        monitor.step_finished(
            summary.step,
            stats,
            reward_mean=summary.reward_mean,
            reward_std=summary.reward_std,
            num_trajectories=summary.episodes,
            learning_rate=self.loaded.areal.actor.optimizer.lr,
            grad_norm=summary.grad_norm,
            checkpoint_path=str(checkpoint) if checkpoint is not None else None,
            metrics={
                "success_rate": summary.success_rate,
                "rejected_groups": summary.rejected_groups,
                "uniform_groups": summary.uniform_groups,
                "rejected_episodes": summary.rejected_episodes,
                "reject_reasons": summary.reject_reasons,
                "gym_retries": summary.retries,
                "gym_retry_wait_s": round(summary.retry_wait_s, 3),
                "restored_executions": summary.restored,
                "engine_retries": summary.engine_retries,
                "recovery_s": round(summary.recovery_s, 3),
                "recovered_episodes": summary.recovered_episodes,
                "fault_wait_s": round(summary.wait_s, 3),
                "rejected_episode_s": round(summary.rejected_s, 3),
                "rollout_s": round(summary.rollout_seconds, 3),
                "rollout_share": round(summary.rollout_share, 4),
                **(
                    {
                        "credit/branch_points": summary.branch_points,
                        "credit/extra_env_steps": summary.extra_env_steps,
                        "credit/env_steps": summary.env_steps,
                        "credit/signal_groups": summary.signal_groups,
                        "credit/groups": summary.groups,
                        "credit/replayed_samples": summary.replayed_samples,
                    }
                    if self.loaded.cua.agent.credit.any
                    else {}
                ),
            },
            status="completed",
        )

    def _show_step(self, bar: tqdm[int], summary: StepSummary) -> None:
        bar.set_postfix(
            reward=f"{summary.reward_mean:+.2f}",
            success=f"{summary.success_rate:.0%}",
            loss=f"{summary.loss:.3f}" if summary.loss is not None else "-",
        )
        self._log(summary.table_row(self.loaded.cua.agent.credit.any))

    # ------------------------------------------------------------------ evaluation, checkpoint
    async def _evaluate(
        self, session: Session, report: TrainReport, kind: EvalKind, step: int
    ) -> None:
        result = await session.evaluation.run(session.policy.engine, kind=kind, step=step)
        _keep_eval(report, result)
        when = "baseline" if kind == "baseline" else f"eval after step {step}"
        self._log(f"{when}: success {result.success_rate:.0%}")

    async def _play_step(
        self,
        workflow: CUAAgentWorkflow,
        session: Session,
        tasks: list[Task],
        order: TaskOrder,
        step: int,
    ) -> list[GroupOutcome]:
        """The step's groups. With ``credit.dynamic_sampling`` each group without signal is
        replaced by a group of the next task in the order, for at most ``credit.dynamic_rounds``
        further rounds (all rounds' groups are returned)."""
        credit = self.loaded.cua.agent.credit
        engine = session.policy.engine

        async def play(batch: list[Task]) -> list[GroupOutcome]:
            rows = [dict(session.task_row(task), global_step=step) for task in batch]
            return list(await asyncio.gather(*(workflow.arun_group(engine, row) for row in rows)))

        outcomes = await play(tasks)
        if not credit.dynamic_sampling:
            return outcomes
        for _ in range(credit.dynamic_rounds):
            wanted = len(tasks) - sum(o.samples is not None and not o.flat for o in outcomes)
            if wanted <= 0:
                break
            outcomes += await play(order.next_batch(wanted))
        return outcomes

    def _log(self, line: str) -> None:
        """Without progress bars (logs, ``bench/``), progress is a line per step and per
        evaluation, printed as it happens: a run cut off still shows how far it got."""
        if not self.progress:
            print(line, flush=True)

    async def _save(self, policy: Policy) -> Path:
        from areal.api.io_struct import SaveLoadMeta

        path = self.run_dir / "checkpoints" / _version_dir(policy.trainer)
        meta = SaveLoadMeta(
            path=str(path), weight_format="hf", with_optim=False, processor=policy.processor
        )
        await asyncio.to_thread(policy.trainer.save, meta)
        with contextlib.suppress(OSError):
            latest = self.run_dir / "checkpoints" / "latest"
            if latest.is_symlink() or latest.exists():
                latest.unlink()
            latest.symlink_to(path.name)
        return path
