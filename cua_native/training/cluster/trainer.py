"""``CUAPPOTrainer``: AReaL's ``PPOTrainer`` with the CUA run's lifecycle around it.

AReaL 1.0.4's trainer has no callback API, so this subclass hooks the few methods its loop
calls once per step and changes nothing else of the loop:

- **attach** (``attach=["host:port", ...]`` or ``AREAL_LLM_SERVER_ADDRS``): the rollout and
  eval-rollout controllers connect to running inference servers, the way AReaL connects its
  eval rollout to the train rollout's servers. Nothing is launched and ``SGLangConfig.build_args``
  (which demands the ``sglang`` package even when nothing is launched) is never called. The
  rollout workers then hold no GPU, so they run ``attached_engines``' clients, which ask the
  servers for the actor's collective backend (``nccl`` on GPUs) for xccl weight updates;
- **scheduler**: AReaL's own, with the changes of ``local_scheduler``, ``ray_scheduler`` and
  ``slurm_scheduler`` (patience on loaded machines; ports; environment values kept whole; the
  specs' container settings);
- **actor**: ``CUAFSDPPPOActor`` (rows packed under ``sdpa`` too, each screenshot of a
  micro-batch through the vision tower once);
- **workers**: whatever the scheduler started is stopped when ``__init__`` fails half-way (a
  setting AReaL rejects after the actor is up) and after ``close`` (even if part of it failed);
- **monitor** (a ``TrainingMonitor``): the training row around ``train``, the baseline before
  step 0, a step row per step from AReaL's stats (``stats_logger.commit``), eval rows when
  AReaL's evaluator runs the eval rollout.

Episodes are recorded by the rollout workers themselves (``cua_native.monitor.client.worker``)
and linked to the step whose weights generated them (the engine's version).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

from areal.api.cli_args import SchedulingStrategy, SchedulingStrategyType
from areal.api.io_struct import LocalInfServerInfo
from areal.trainer import PPOTrainer
from areal.utils.environ import is_single_controller

from cua_native.monitor.client.lifecycle import TrainingMonitor
from cua_native.training.cluster.attached_engines import (
    WEIGHT_BACKEND_ENV,
    AttachedSGLangEngine,
    AttachedVLLMEngine,
    trainer_weight_backend,
)
from cua_native.training.cluster.local_scheduler import patient_local_scheduler
from cua_native.training.cluster.step_stats import eval_results

logger = logging.getLogger(__name__)

ATTACH_ENV = "AREAL_LLM_SERVER_ADDRS"


def attach_addresses(explicit: Sequence[str] = ()) -> list[str]:
    """Servers to attach to: ``explicit`` or the comma-separated ``AREAL_LLM_SERVER_ADDRS``."""
    if explicit:
        return list(explicit)
    raw = os.environ.get(ATTACH_ENV, "")
    return [a.strip() for a in raw.split(",") if a.strip()]


def _server_info(address: str) -> LocalInfServerInfo:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{ATTACH_ENV}: {address!r} is not host:port")
    return LocalInfServerInfo(host=host, port=int(port), process=None)


class _CommitTap:
    """Forwards everything to AReaL's ``StatsLogger`` and hands each step's stats to a hook."""

    def __init__(self, inner: Any, hook: Callable[[int, dict[str, float]], None]) -> None:
        self._inner = inner
        self._hook = hook

    def commit(self, epoch: int, step: int, global_step: int, data: Any) -> None:
        self._inner.commit(epoch, step, global_step, data)
        stats = data[0] if isinstance(data, list) and data else data
        self._hook(global_step, dict(stats or {}))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def name_weight_backend(config: Any) -> None:
    """Tell the rollout workers which backend the actor's weight-update group uses (they
    attach to servers from CPU-only processes, and AReaL would otherwise ask for ``gloo``
    while an actor on GPUs creates an ``nccl`` group: see ``attached_engines``). A value the
    config sets in a rollout spec wins."""
    actor_gpus = max((spec.gpu for spec in config.actor.scheduling_spec), default=0)
    backend = trainer_weight_backend(actor_gpus)
    for spec in config.rollout.scheduling_spec:
        spec.env_vars = {WEIGHT_BACKEND_ENV: backend, **dict(spec.env_vars)}


class CUAPPOTrainer(PPOTrainer):
    stats_logger: Any
    """AReaL's ``StatsLogger``, wrapped in ``_CommitTap`` once the base class has made it."""

    def __init__(
        self,
        config: Any,
        train_dataset: Any = None,
        valid_dataset: Any = None,
        *,
        attach: Sequence[str] = (),
        monitor: TrainingMonitor | None = None,
        model_name: str = "",
        baseline: bool = False,
    ) -> None:
        self._attach = [_server_info(a) for a in attach_addresses(attach)]
        self._monitor = monitor
        self._model_name = model_name or str(config.actor.path)
        self._baseline = baseline
        self._eval_due: int | None = None
        if self._attach:
            name_weight_backend(config)
        try:
            super().__init__(config, train_dataset=train_dataset, valid_dataset=valid_dataset)
        except BaseException:
            # AReaL has no ``close`` for a half-built trainer: the workers its scheduler
            # started (actor, rollout) would outlive this process
            self._release_workers()
            raise
        self.stats_logger = _CommitTap(self.stats_logger, self._on_step_stats)

    def close(self) -> None:
        """AReaL's ``close``, then whatever workers its scheduler still runs, even when a part
        of ``close`` failed."""
        try:
            super().close()
        finally:
            self._release_workers()

    def _release_workers(self) -> None:
        scheduler = getattr(self, "scheduler", None)  # None until AReaL made one
        if scheduler is None:
            return
        try:
            scheduler.delete_workers()  # every role; roles already deleted are gone from it
        except Exception:
            logger.exception("could not stop the scheduler's workers")

    # --- engines ---------------------------------------------------------------------------

    def _init_scheduler(self) -> Any:
        if self.config.scheduler.type == "local":
            return patient_local_scheduler(self.config)
        if self.config.scheduler.type == "ray":
            from cua_native.training.cluster.ray_scheduler import patient_ray_scheduler

            return patient_ray_scheduler(self.config)
        if self.config.scheduler.type == "slurm":
            from cua_native.training.cluster.slurm_scheduler import slurm_scheduler

            return slurm_scheduler(self.config)
        return super()._init_scheduler()

    def _create_train_engine(self, actor_config: Any, alloc: Any) -> Any:
        if alloc.backend != "fsdp":
            return super()._create_train_engine(actor_config, alloc)
        from cua_native.training.cluster.fsdp_actor import CUAFSDPPPOActor

        if is_single_controller():
            actor = CUAFSDPPPOActor.as_controller(actor_config, self.scheduler)
        else:
            actor = CUAFSDPPPOActor(config=actor_config)
        actor.create_process_group(parallel_strategy=alloc.parallel)
        return actor

    def _init_rollout(
        self, rollout_config: Any, is_eval: bool = False, lora_path: str | None = None
    ) -> Any:
        if not self._attach:
            return super()._init_rollout(rollout_config, is_eval=is_eval, lora_path=lora_path)
        if lora_path is not None:
            raise ValueError("attaching to running servers does not load LoRA adapters")
        config = deepcopy(rollout_config)
        engine_cls = (
            AttachedSGLangEngine if self.rollout_alloc.backend == "sglang" else AttachedVLLMEngine
        )
        if is_eval:
            config.max_head_offpolicyness = int(1e12)
            config.scheduling_strategy = SchedulingStrategy(
                type=SchedulingStrategyType.colocation, target="rollout"
            )
            for spec in config.scheduling_spec:
                spec.gpu = 0
        if not is_single_controller():
            engine = engine_cls(config)
            engine.initialize(
                addr=[f"{s.host}:{s.port}" for s in self._attach],
                train_data_parallel_size=self.actor_alloc.parallel.dp_size,
            )
            return engine
        if len(self._attach) != self.rollout_alloc.parallel.dp_size:
            raise ValueError(
                f"{ATTACH_ENV} names {len(self._attach)} servers but rollout.backend "
                f"{self.config.rollout.backend!r} has {self.rollout_alloc.parallel.dp_size}"
            )
        controller = engine_cls.as_controller(config, self.scheduler)
        controller.initialize(
            role="eval-rollout" if is_eval else "rollout", server_infos=list(self._attach)
        )
        return controller

    # --- lifecycle -------------------------------------------------------------------------

    def train(
        self,
        workflow: Any = None,
        eval_workflow: Any = None,
        workflow_kwargs: dict[str, Any] | None = None,
        eval_workflow_kwargs: dict[str, Any] | None = None,
        baseline_workflow_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if self._monitor is None:
            super().train(workflow, eval_workflow, workflow_kwargs, eval_workflow_kwargs, **kwargs)
            return
        with self._monitor:
            if self._baseline and eval_workflow is not None and self.valid_dataloader is not None:
                self._run_baseline(eval_workflow, baseline_workflow_kwargs or eval_workflow_kwargs)
            start = self.recover_info.last_step_info.next().global_step if self.recover_info else 0
            self._monitor.step_started(start)
            super().train(workflow, eval_workflow, workflow_kwargs, eval_workflow_kwargs, **kwargs)

    def _run_baseline(self, workflow: Any, kwargs: dict[str, Any] | None) -> None:
        assert self._monitor is not None and self.eval_rollout is not None
        total = len(self.valid_dataloader.dataset) if self.valid_dataloader is not None else None
        self._monitor.baseline_started(self._model_name, total_tasks=total)
        PPOTrainer._evaluate_fn(self, eval_workflow=workflow, eval_workflow_kwargs=kwargs)
        results = eval_results(self.eval_rollout.export_stats())
        self._monitor.baseline_finished(**results)

    def _evaluate_fn(self, eval_workflow: Any, eval_workflow_kwargs: Any) -> None:
        # AReaL's evaluator calls this only when an eval is due (evaluator.freq_steps)
        step = self._eval_due
        if self._monitor is not None and step is not None:
            total = (
                len(self.valid_dataloader.dataset) if self.valid_dataloader is not None else None
            )
            self._monitor.eval_started(step, self._model_name, total_tasks=total)
        super()._evaluate_fn(eval_workflow, eval_workflow_kwargs)
        self._eval_ran = True

    def _evaluate(
        self,
        eval_workflow: Any,
        eval_workflow_kwargs: Any,
        epoch: int,
        epoch_step: int,
        global_step: int,
    ) -> None:
        self._eval_due, self._eval_ran = global_step, False
        super()._evaluate(eval_workflow, eval_workflow_kwargs, epoch, epoch_step, global_step)

    def _on_step_stats(self, global_step: int, stats: dict[str, float]) -> None:
        if self._monitor is None:
            return
        if getattr(self, "_eval_ran", False) and self._eval_due == global_step:
            self._monitor.eval_finished(global_step, **eval_results(stats))
            self._eval_ran = False
        self._monitor.step_finished(global_step, stats)  # AReaL names, mapped by the monitor
        total = self.config.total_train_steps
        if total is None or global_step + 1 < total:
            self._monitor.step_started(global_step + 1)
