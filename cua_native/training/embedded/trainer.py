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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cua_native.config import LoadedConfig
from cua_native.gym.protocol import Gym, Task
from cua_native.monitor.client.lifecycle import redact
from cua_native.rollout.records import EpisodeObserver, EpisodeTally, FanoutObserver
from cua_native.rollout.runtime import freeze_startup_heap
from cua_native.training.embedded.evaluation import EvalResult, evaluation_for
from cua_native.training.embedded.task_order import TaskOrder

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

    def table_row(self) -> str:
        """This step as a row under ``STEP_TABLE_HEADER``."""
        loss = f"{self.loss:8.4f}" if self.loss is not None else f"{'-':>8}"
        adv = f"{self.adv_abs:6.3f}" if self.adv_abs is not None else f"{'-':>6}"
        gap = f"{self.logp_gap:7.1e}" if self.logp_gap is not None else f"{'-':>7}"
        grad = f"{self.grad_norm:7.3f}" if self.grad_norm is not None else f"{'-':>7}"
        return (
            f"{self.step:>4} {self.episodes:>8} {self.success_rate:>8.0%} "
            f"{self.reward_mean:>8.3f} {self.reward_std:>6.3f} {self.turns_mean:>6.1f} "
            f"{self.samples:>7} {self.uniform_groups:>7} {loss} {adv} {gap} {grad} "
            f"{self.seconds:>6.1f}"
        )


STEP_TABLE_HEADER = (
    f"{'step':>4} {'episodes':>8} {'success':>8} {'reward':>8} {'±':>6} {'turns':>6} "
    f"{'samples':>7} {'uniform':>7} {'loss':>8} {'|adv|':>6} {'logp Δ':>7} {'|grad|':>7} {'sec':>6}"
)
"""Columns of the step table: what ``print_report`` prints at the end of a run and, without
progress bars, the trainer prints as each step finishes."""


@dataclass(slots=True)
class TrainReport:
    run_dir: Path
    model_dir: Path
    monitor_url: str | None
    steps: list[StepSummary] = field(default_factory=list)
    baseline_success: float | None = None
    evals: dict[int, float] = field(default_factory=dict)
    baseline_outcomes: dict[str, list[bool]] | None = None
    """Task id → success of each baseline episode (for the paired interval)."""
    eval_outcomes: dict[int, dict[str, list[bool]]] = field(default_factory=dict)
    eval_parse_errors: dict[int, float] = field(default_factory=dict)
    """Evaluation step (-1: baseline) → parse errors per model turn."""
    eval_false_done: dict[int, float] = field(default_factory=dict)
    """Evaluation step (-1: baseline) → share of episodes ended by a failed "done"."""
    checkpoint: Path | None = None
    warm_start: dict[str, Any] | None = None
    evaluations: dict[int, EvalResult] = field(default_factory=dict)
    """Evaluation step (-1: baseline) → its result."""


def _ppo_step(actor: Any, batch: list[dict[str, Any]], ref: Any = None) -> dict[str, float]:
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


def _version_dir(trainer_engine: Any) -> str:
    """The checkpoint directory name of the trainer's current weights."""
    return f"version-{trainer_engine.get_version()}"


def _eval_due(every: int, step: int, total_steps: int) -> bool:
    """Evaluate every ``every`` steps and after the last step (so the final model is always
    measured); never when ``every`` is 0."""
    return every > 0 and ((step + 1) % every == 0 or step + 1 == total_steps)


def _is_uniform(group: dict[str, Any]) -> bool:
    """Whether a group is uniform: its rows' (group-normalised) rewards are all 0, as equal
    episode rewards give up to rounding (a mean of equal floats may differ from them in the
    last bit)."""
    return not bool(group["rewards"].abs().max() > 1e-6)


def _keep_eval(report: TrainReport, result: EvalResult) -> None:
    """An evaluation's figures in the report, under its step (the baseline: -1)."""
    point = -1 if result.kind == "baseline" else result.step
    report.evaluations[point] = result
    if result.kind == "baseline":
        report.baseline_success = result.success_rate
        report.baseline_outcomes = result.outcomes
    else:
        report.evals[result.step] = result.success_rate
        report.eval_outcomes[result.step] = result.outcomes
    report.eval_parse_errors[point] = result.parse_errors_per_turn
    report.eval_false_done[point] = result.false_done_rate


def _pick(stats: dict[str, float], suffix: str) -> float | None:
    for key, value in stats.items():
        if key.endswith(suffix):
            return float(value)
    return None


class EmbeddedTrainer:
    """Owns the engines, the gym and the monitor for one embedded training run."""

    def __init__(self, loaded: LoadedConfig, *, progress: bool = True) -> None:
        self.loaded = loaded
        self.progress = progress
        self.run_dir = Path(loaded.cua.run_dir)
        self.rng = random.Random(loaded.areal.seed)
        self._ref: Any = None
        """A frozen copy of the starting model when ``actor.kl_ctl`` > 0."""

    # ------------------------------------------------------------------ set-up
    async def _tasks(self, gym: Gym) -> tuple[list[Task], list[Task]]:
        from cua_native.rollout.dataset import load_tasks

        cua = self.loaded.cua
        train = await load_tasks(cua.tasks, gym)
        evals = await load_tasks(cua.eval_tasks, gym) if cua.eval_tasks is not None else []
        if not train:
            raise ValueError("cua.tasks selected no tasks; loosen its filters")
        return train, evals

    # ------------------------------------------------------------------ phases
    async def run(self) -> TrainReport:
        import torch
        from areal.trainer.ppo.actor import PPOActor
        from transformers import AutoModelForImageTextToText

        from cua_native.monitor.client.lifecycle import TrainingMonitor, new_run_name
        from cua_native.monitor.client.recorder import recorder_from_config
        from cua_native.rollout.dataset import task_row
        from cua_native.rollout.factories import load_processor, make_gym
        from cua_native.rollout.workflow import CUAAgentWorkflow
        from cua_native.training.embedded.model import load_inference_engine, prepare_model
        from cua_native.training.local_engine import LocalTrainEngine

        areal, cua = self.loaded.areal, self.loaded.cua
        self.run_dir.mkdir(parents=True, exist_ok=True)
        report = TrainReport(
            run_dir=self.run_dir, model_dir=self.run_dir, monitor_url=cua.monitor_db_url()
        )
        (self.run_dir / "config.json").write_text(
            json.dumps(redact({"cua": cua.model_dump(mode="json")}), indent=2)
        )
        start = await asyncio.to_thread(prepare_model, self.loaded, progress=self.progress)
        model_dir = report.model_dir = start.path
        report.warm_start = start.warm_start
        processor = await asyncio.to_thread(load_processor, model_dir)
        engine = await load_inference_engine(self.loaded, model_dir)
        model = await asyncio.to_thread(
            AutoModelForImageTextToText.from_pretrained, model_dir, dtype=torch.float32
        )
        optim = areal.actor.optimizer
        trainer_engine = LocalTrainEngine(
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
        actor = PPOActor(areal.actor, trainer_engine)
        if areal.actor.kl_ctl > 0:  # the frozen starting policy, for AReaL's KL reward
            self._ref = LocalTrainEngine(
                copy.deepcopy(model).eval(), temperature=areal.actor.temperature, device=cua.device
            )
        gym = make_gym(cua.agent.gym)
        recorder = recorder_from_config(
            cua.monitor_db_url(),
            cua.monitor_url,
            cua.monitor_token,
            self.run_dir,
            model_path=str(model_dir),
            run_name=new_run_name(f"{areal.experiment_name}_{areal.trial_name}"),
        )
        monitor = TrainingMonitor(
            recorder,
            model_name=str(model_dir),
            config={"cua": cua.model_dump(mode="json")},
            log_path=str(self.run_dir),
            experiment=areal.experiment_name,
            trial=areal.trial_name,
        )
        freeze_startup_heap()
        try:
            async with monitor:
                report = await self._train(
                    report,
                    engine,
                    actor,
                    trainer_engine,
                    gym,
                    processor,
                    monitor,
                    workflow_cls=CUAAgentWorkflow,
                    task_row=functools.partial(task_row, gym_id=gym.gym_id),
                )
        finally:
            await gym.aclose()
            await asyncio.to_thread(engine.destroy)
        return report

    async def _train(
        self,
        report: TrainReport,
        engine: Any,
        actor: Any,
        trainer_engine: Any,
        gym: Gym,
        processor: Any,
        monitor: Any,
        *,
        workflow_cls: Any,
        task_row: Any,
    ) -> TrainReport:
        from tqdm import tqdm

        areal, cua = self.loaded.areal, self.loaded.cua
        train_tasks, eval_tasks = await self._tasks(gym)
        total_steps = areal.total_train_steps or max(
            1, len(train_tasks) // areal.train_dataset.batch_size
        )
        monitor.total_steps = total_steps
        optim = areal.actor.optimizer
        trainer_engine.schedule_lr(
            optim.lr_scheduler_type,
            total_steps,
            warmup_proportion=optim.warmup_steps_proportion,
            min_lr_ratio=optim.min_lr_ratio,
        )
        # A task played under several gym seeds is one task to the monitor.
        monitor.tasks(list({t.task_id: t for t in train_tasks + eval_tasks}.values()))

        def workflow(source: str, observers: list[EpisodeObserver]) -> Any:
            return workflow_cls(
                cua.agent if source == "step" else cua.eval_agent(),
                source=source,
                gym=gym,
                processor=processor,
                observer=FanoutObserver(monitor.recorder, *observers),
            )

        evaluation = evaluation_for(
            self.loaded, eval_tasks, gym=gym, processor=processor, monitor=monitor
        )
        if cua.baseline and eval_tasks:
            result = await evaluation.run(engine, kind="baseline")
            _keep_eval(report, result)
            self._log(f"baseline: success {result.success_rate:.0%}")
        batch_size = min(areal.train_dataset.batch_size, len(train_tasks))
        order = TaskOrder(train_tasks, self.rng)
        bar = tqdm(range(total_steps), desc="train", unit="step", disable=not self.progress)
        self._log(STEP_TABLE_HEADER)
        for step in bar:
            started = time.perf_counter()
            tasks = order.next_batch(batch_size)
            monitor.step_started(step)
            tally = EpisodeTally()
            flow = workflow("step", [tally])
            rows = [dict(task_row(t), global_step=step) for t in tasks]
            results = await asyncio.gather(*(flow.arun_episode(engine, row) for row in rows))
            batch = [r for r in results if r is not None]
            rejected = len(results) - len(batch)
            uniform_flags = [_is_uniform(b) for b in batch]
            uniform = uniform_flags.count(True)
            if cua.skip_uniform_groups:
                batch = [b for b, flag in zip(batch, uniform_flags, strict=True) if not flag]
            summary = StepSummary(
                step=step,
                episodes=tally.completed,
                rejected_groups=rejected,
                uniform_groups=uniform,
                success_rate=tally.success_rate,
                reward_mean=tally.reward_mean,
                reward_std=tally.reward_std,
                turns_mean=tally.turns_mean,
                samples=sum(int(b["input_ids"].shape[0]) for b in batch),
            )
            stats: dict[str, float] = {}
            if batch:
                monitor.step_training(step)
                stats = await asyncio.to_thread(_ppo_step, actor, batch, self._ref)
                summary.loss = _pick(stats, "actor_loss/avg")
                summary.grad_norm = _pick(stats, "grad_norm")
                summary.logp_gap = stats.get("cua/logp_gap/avg")
                summary.adv_abs = stats.get("cua/adv_abs/avg")
                version = trainer_engine.get_version() + 1
                trainer_engine.set_version(version)
                await asyncio.wrap_future(
                    engine.update_weights_from_state_dict(trainer_engine.state_dict(), version)
                )
            checkpoint = None
            if areal.saver.freq_steps and (step + 1) % areal.saver.freq_steps == 0:
                checkpoint = report.checkpoint = await self._save(trainer_engine, processor)
            summary.seconds = time.perf_counter() - started
            report.steps.append(summary)
            monitor.step_finished(
                step,
                stats,
                reward_mean=summary.reward_mean,
                reward_std=summary.reward_std,
                num_trajectories=summary.episodes,
                learning_rate=areal.actor.optimizer.lr,
                grad_norm=summary.grad_norm,
                checkpoint_path=str(checkpoint) if checkpoint is not None else None,
                metrics={
                    "success_rate": summary.success_rate,
                    "rejected_groups": summary.rejected_groups,
                    "uniform_groups": summary.uniform_groups,
                },
                status="completed",
            )
            bar.set_postfix(
                reward=f"{summary.reward_mean:+.2f}",
                success=f"{summary.success_rate:.0%}",
                loss=f"{summary.loss:.3f}" if summary.loss is not None else "-",
            )
            self._log(summary.table_row())
            if eval_tasks and _eval_due(cua.eval_every, step, total_steps):
                result = await evaluation.run(engine, kind="eval", step=step)
                _keep_eval(report, result)
                self._log(f"eval after step {step}: success {result.success_rate:.0%}")
        if report.checkpoint is None or report.checkpoint.name != _version_dir(trainer_engine):
            report.checkpoint = await self._save(trainer_engine, processor)
        return report

    def _log(self, line: str) -> None:
        """Without progress bars (logs, ``bench/``), progress is a line per step and per
        evaluation, printed as it happens: a run cut off still shows how far it got."""
        if not self.progress:
            print(line, flush=True)

    async def _save(self, trainer_engine: Any, processor: Any) -> Path:
        from areal.api.io_struct import SaveLoadMeta

        path = self.run_dir / "checkpoints" / _version_dir(trainer_engine)
        meta = SaveLoadMeta(
            path=str(path), weight_format="hf", with_optim=False, processor=processor
        )
        await asyncio.to_thread(trainer_engine.save, meta)
        with contextlib.suppress(OSError):
            latest = self.run_dir / "checkpoints" / "latest"
            if latest.is_symlink() or latest.exists():
                latest.unlink()
            latest.symlink_to(path.name)
        return path
