"""The cluster path: AReaL's ``PPOTrainer`` (GRPO) with the CUA workflow.

``plan_cluster_run`` does everything that needs no GPU — the load-time checks
(``cua_native.training.cluster.checks``), task loading from the gym server, the train/eval datasets,
the workflow's serializable kwargs, the workers' environment — so it is tested on CPU;
``run_cluster`` hands the plan to ``CUAPPOTrainer``, which starts AReaL's scheduler (local, Ray
or Slurm), the inference servers (or attaches to running ones) and the FSDP actor.

Rollout workers build their own recorder from the environment (``CUA_MONITOR_*``, see
``cua_native.monitor.client.worker``), since live objects do not cross process boundaries. The
environment reaches them through AReaL's scheduling specs (``env_vars``), which the local, Ray
and Slurm schedulers all apply to the workers they start.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

from cua_native.config import ConfigError, LoadedConfig
from cua_native.monitor.client.lifecycle import RUN_NAME_ENV
from cua_native.training.cluster.checks import (
    backend_name,
    check_cluster_config,
    check_pixel_budget,
)
from cua_native.training.cluster.multinode import (
    check_shared_storage,
    is_loopback_host,
    spans_nodes,
)
from cua_native.training.cluster.slurm_scheduler import check_slurm_env

WORKFLOW_PATH = "cua_native.workflow.CUAAgentWorkflow"
WORKER_OBSERVER = "cua_native.monitor.client.worker.observer_from_env"


@dataclass(frozen=True)
class ClusterPlan:
    train_rows: list[dict[str, Any]]
    eval_rows: list[dict[str, Any]]
    workflow_kwargs: dict[str, Any]
    eval_workflow_kwargs: dict[str, Any]
    baseline_workflow_kwargs: dict[str, Any]
    worker_env: dict[str, str]


async def _rows(loaded: LoadedConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from cua_native.rollout.dataset import load_tasks, task_row
    from cua_native.rollout.factories import make_gym

    cua = loaded.cua
    gym = make_gym(cua.agent.gym)
    try:
        train = await load_tasks(cua.tasks, gym)
        evals = await load_tasks(cua.eval_tasks, gym) if cua.eval_tasks is not None else []
    finally:
        await gym.aclose()
    gym_id = cua.agent.gym.gym_id
    # one row per eval task: its group (the eval workflow's group_size) is
    # cua.eval_episodes_per_task episodes
    return [task_row(t, gym_id) for t in train], [task_row(t, gym_id) for t in evals]


def run_name(loaded: LoadedConfig) -> str:
    """The name the trainer's and the workers' recorders share (the run directory's name)."""
    return loaded.cua.run_dir.resolve().name


def worker_env(loaded: LoadedConfig) -> dict[str, str]:
    """What rollout workers need to record episodes, and the allocator settings of
    ``runtime.tune_allocator`` (glibc reads them at process start). Settings already in the
    environment win."""
    from cua_native.rollout.runtime import ALLOCATOR_ENV

    cua = loaded.cua
    env = {k: os.environ.get(k, v) for k, v in ALLOCATOR_ENV.items()}
    env["CUA_RUN_DIR"] = str(cua.run_dir.resolve())
    env[RUN_NAME_ENV] = run_name(loaded)
    if cua.monitor_url:
        env["CUA_MONITOR_URL"] = cua.monitor_url
    db = cua.monitor_db_url()
    if db:
        env["CUA_MONITOR_DB"] = db
    token = cua.monitor_token or os.environ.get("CUA_MONITOR_TOKEN")
    if token:
        env["CUA_MONITOR_TOKEN"] = token
    return env


def apply_worker_env(loaded: LoadedConfig, env: dict[str, str]) -> None:
    """Put ``env`` in every scheduling spec of the actor and the rollout (AReaL's local, Ray and
    Slurm schedulers start workers with their spec's ``env_vars``); a value the config
    already sets there wins."""
    for part in (loaded.areal.actor, loaded.areal.rollout):
        for spec in part.scheduling_spec:
            spec.env_vars = {**env, **dict(spec.env_vars)}


def prepare_areal_config(loaded: LoadedConfig, eval_rows: list[dict[str, Any]]) -> None:
    """Fill the AReaL fields the CUA run derives: the eval dataset (AReaL only builds its eval
    loader when ``valid_dataset`` is set) and vLLM's media allow-list (the gym's)."""
    from areal.api.cli_args import ValidDatasetConfig

    areal = loaded.areal
    if eval_rows and areal.valid_dataset is None:
        areal.valid_dataset = ValidDatasetConfig(
            path="gym-tasks",
            type="rl",
            batch_size=min(len(eval_rows), areal.train_dataset.batch_size),
        )
    if backend_name(loaded) == "vllm":
        areal.vllm.allowed_media_domains = list(loaded.cua.agent.gym.allowed_media_domains)


def plan_cluster_run(
    loaded: LoadedConfig, processor: Any = None, *, one_host: bool = False
) -> ClusterPlan:
    """Checks (config, then the pixel budget against the model's processor), tasks, kwargs.
    ``one_host``: a Ray or Slurm cluster of this machine alone (``check_cluster_config``)."""
    from cua_native.rollout.factories import load_processor
    from cua_native.rollout.workflow import workflow_kwargs

    check_cluster_config(loaded, one_host=one_host)
    if processor is None:
        try:
            processor = load_processor(loaded.areal.actor.path)
        except OSError as e:
            raise ConfigError(
                f"config error: actor.path: cannot load its processor ({e})"
            ) from None
    check_pixel_budget(loaded, processor)
    path = {"model_path": loaded.areal.actor.path}
    agent = loaded.cua.agent.model_copy(update=path)
    train_rows, eval_rows = asyncio.run(_rows(loaded))
    if not train_rows:
        raise ConfigError(
            "config error: cua.tasks: selected no tasks from the gym; loosen its filters"
        )
    prepare_areal_config(loaded, eval_rows)

    eval_agent = loaded.cua.eval_agent().model_copy(update=path)

    def kwargs(source: str) -> dict[str, Any]:
        played = agent if source == "step" else eval_agent
        # trained rows cross AReaL's process boundary: screenshots as uint8 palette indices
        extra = {"compact_pixels": True} if source == "step" else {}
        return workflow_kwargs(played, source=source, observer_factory=WORKER_OBSERVER, **extra)

    return ClusterPlan(
        train_rows=train_rows,
        eval_rows=eval_rows,
        workflow_kwargs=kwargs("step"),
        eval_workflow_kwargs=kwargs("eval"),
        baseline_workflow_kwargs=kwargs("baseline"),
        worker_env=worker_env(loaded),
    )


def make_monitor(loaded: LoadedConfig, plan: ClusterPlan) -> Any:
    """The trainer process's ``TrainingMonitor`` (``None`` without a store or monitor URL)."""
    cua = loaded.cua
    db, url = cua.monitor_db_url(), cua.monitor_url
    if not db and not url:
        return None
    from cua_native.monitor.client.lifecycle import TrainingMonitor
    from cua_native.monitor.client.recorder import recorder_from_config

    token = cua.monitor_token or os.environ.get("CUA_MONITOR_TOKEN")
    recorder = recorder_from_config(db, url, token, cua.run_dir, run_name=run_name(loaded))
    recorder.start_in_thread()
    areal = loaded.areal
    return TrainingMonitor(
        recorder,
        model_name=str(areal.actor.path),
        config={"cua": cua.model_dump(mode="json"), "backend": areal.rollout.backend},
        total_steps=areal.total_train_steps,
        experiment=areal.experiment_name,
        trial=areal.trial_name,
    )


def check_attach(loaded: LoadedConfig, attach: list[str]) -> None:
    """Servers to attach to must be reachable from every node when workers may run on others."""
    from cua_native.training.cluster.trainer import ATTACH_ENV

    if not spans_nodes(loaded):
        return
    for address in attach:
        if is_loopback_host(address.rpartition(":")[0]):
            raise ConfigError(
                f"config error: {ATTACH_ENV}: {address!r} is a loopback address, which names a "
                f"different host on every node (scheduler.type {loaded.areal.scheduler.type!r})"
            )


def run_cluster(
    loaded: LoadedConfig, *, attach: list[str] | None = None, one_host: bool = False
) -> None:
    """Train with AReaL's PPOTrainer (``CUAPPOTrainer``). ``attach``: running inference servers
    (``host:port``; default ``AREAL_LLM_SERVER_ADDRS``) instead of launching them. ``one_host``:
    the Ray or Slurm cluster is this machine alone (a rehearsal): the checks of spanning nodes
    (``multinode``) are skipped."""
    import datasets

    from cua_native.monitor.client.lifecycle import handle_sigterm
    from cua_native.training.cluster.trainer import CUAPPOTrainer, attach_addresses

    check_cluster_config(loaded, one_host=one_host)
    check_slurm_env(loaded, worker_env(loaded))
    if not one_host:
        check_attach(loaded, attach_addresses(attach or ()))
        check_shared_storage(loaded)
    if loaded.areal.scheduler.type == "ray":
        from cua_native.training.cluster.ray_scheduler import connect_ray

        connect_ray()  # before handle_sigterm below: ray.init replaces the SIGTERM handler
    plan = plan_cluster_run(loaded, one_host=one_host)
    os.environ.update(plan.worker_env)
    apply_worker_env(loaded, plan.worker_env)
    train = datasets.Dataset.from_list(plan.train_rows)
    valid = datasets.Dataset.from_list(plan.eval_rows) if plan.eval_rows else None
    monitor = make_monitor(loaded, plan)
    try:
        # SIGTERM (a scheduler's kill, ``timeout``) raises, so the trainer's cleanup runs
        with (
            handle_sigterm(),
            CUAPPOTrainer(
                loaded.areal,
                train_dataset=train,
                valid_dataset=valid,
                attach=attach or (),
                monitor=monitor,
                baseline=loaded.cua.baseline,
            ) as trainer,
        ):
            trainer.train(
                workflow=WORKFLOW_PATH,
                workflow_kwargs=plan.workflow_kwargs,
                eval_workflow=WORKFLOW_PATH if valid is not None else None,
                eval_workflow_kwargs=plan.eval_workflow_kwargs if valid is not None else None,
                baseline_workflow_kwargs=plan.baseline_workflow_kwargs,
            )
    finally:
        if monitor is not None:
            monitor.recorder.close_in_thread()
