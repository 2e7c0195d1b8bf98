"""The cluster path: AReaL's ``PPOTrainer`` (GRPO) with the CUA workflow.

``plan_cluster_run`` does everything that needs no GPU — task loading from the gym server, the
train/eval datasets, the workflow's serializable kwargs, the vLLM command AReaL will launch —
so it is tested on CPU; ``run_cluster`` hands the plan to ``PPOTrainer``, which starts AReaL's
scheduler (local, Ray or Slurm), the inference servers and the FSDP/Megatron actor.

Rollout workers build their own recorder from the environment (``CUA_MONITOR_*``, see
``cua_native.monitor.client.worker``), since live objects do not cross process boundaries.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

from cua_native.config import ConfigError, LoadedConfig

WORKFLOW_PATH = "cua_native.rollout.workflow.CUAAgentWorkflow"
WORKER_OBSERVER = "cua_native.monitor.client.worker.observer_from_env"


@dataclass(frozen=True)
class ClusterPlan:
    train_rows: list[dict[str, Any]]
    eval_rows: list[dict[str, Any]]
    workflow_kwargs: dict[str, Any]
    eval_workflow_kwargs: dict[str, Any]
    vllm_command: list[str]
    worker_env: dict[str, str]


def _check(loaded: LoadedConfig) -> None:
    areal, cua = loaded.areal, loaded.cua
    if not areal.actor.path:
        raise ConfigError(
            "config error: actor.path must name the model to train (a local directory or a "
            "Hugging Face id already in the cluster's cache)"
        )
    if cua.agent.gym.kind not in ("http", "adb") or not cua.agent.gym.base_url:
        raise ConfigError(
            "config error: cua.agent.gym must be kind 'http' or 'adb' with a base_url in "
            "cua.mode 'areal'"
        )
    backend = areal.rollout.backend.split(":", 1)[0]
    if backend not in {"vllm", "sglang"}:
        raise ConfigError(
            f"config error: rollout.backend must start with 'vllm:' or 'sglang:' (got {areal.rollout.backend!r})"
        )


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
    return [task_row(t, gym_id) for t in train], [task_row(t, gym_id) for t in evals]


def worker_env(loaded: LoadedConfig) -> dict[str, str]:
    """What rollout workers need to record episodes, and the allocator settings of
    ``runtime.tune_allocator`` (glibc reads them at process start), inherited through the
    scheduler. Settings already in the environment win."""
    from cua_native.rollout.runtime import ALLOCATOR_ENV

    cua = loaded.cua
    env = {k: os.environ.get(k, v) for k, v in ALLOCATOR_ENV.items()}
    env["CUA_RUN_DIR"] = str(cua.run_dir.resolve())
    if cua.monitor_url:
        env["CUA_MONITOR_URL"] = cua.monitor_url
    db = cua.monitor_db_url()
    if db:
        env["CUA_MONITOR_DB"] = db
    token = cua.monitor_token or os.environ.get("CUA_MONITOR_TOKEN")
    if token:
        env["CUA_MONITOR_TOKEN"] = token
    return env


def plan_cluster_run(loaded: LoadedConfig) -> ClusterPlan:
    from areal.api.cli_args import vLLMConfig

    from cua_native.rollout.workflow import workflow_kwargs

    _check(loaded)
    agent = loaded.cua.agent.model_copy(update={"model_path": loaded.areal.actor.path})
    train_rows, eval_rows = asyncio.run(_rows(loaded))
    if not train_rows:
        raise ConfigError(
            "config error: cua.tasks selected no tasks from the gym; loosen its filters"
        )
    return ClusterPlan(
        train_rows=train_rows,
        eval_rows=eval_rows,
        workflow_kwargs=workflow_kwargs(agent, source="step", observer_factory=WORKER_OBSERVER),
        eval_workflow_kwargs=workflow_kwargs(
            agent.model_copy(update={"group_size": loaded.cua.eval_episodes_per_task}),
            source="eval",
            observer_factory=WORKER_OBSERVER,
        ),
        vllm_command=vLLMConfig.build_cmd(loaded.areal.vllm, tp_size=1, pp_size=1),
        worker_env=worker_env(loaded),
    )


def run_cluster(loaded: LoadedConfig) -> None:
    """Train with AReaL's PPOTrainer. Needs GPUs and vLLM or SGLang on the cluster."""
    import datasets
    from areal.trainer import PPOTrainer

    plan = plan_cluster_run(loaded)
    os.environ.update(plan.worker_env)
    train = datasets.Dataset.from_list(plan.train_rows)
    valid = datasets.Dataset.from_list(plan.eval_rows) if plan.eval_rows else None
    with PPOTrainer(loaded.areal, train_dataset=train, valid_dataset=valid) as trainer:
        trainer.train(
            workflow=WORKFLOW_PATH,
            workflow_kwargs=plan.workflow_kwargs,
            eval_workflow=WORKFLOW_PATH if valid is not None else None,
            eval_workflow_kwargs=plan.eval_workflow_kwargs if valid is not None else None,
        )
