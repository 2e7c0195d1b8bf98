"""AReaL #1471 and #1345 on our path: the rollout's staleness capacity, with AReaL's own classes.

The cluster path runs AReaL 1.0.4's ``RolloutController`` (single-controller mode): it gates
submissions with its own ``StalenessManager`` (capacity ``min(max_concurrent - running,
(max_head_offpolicyness + version + 1) * consumer_batch_size - accepted - running)``) and starts
one rollout worker process per server, whose ``RemoteInfEngine`` runs a second, local manager.

- **#1471** (capacity divided across data-parallel ranks) bites: each worker's
  ``RemoteSGLangEngine.initialize``, given no ``train_data_parallel_size`` (AReaL's controller
  gives none), divides its local ``max_concurrent_rollouts`` and ``consumer_batch_size`` by the
  rollout's data-parallel size; round-robin dispatch makes those shares binding. Shown on real
  worker processes started by our ``PatientLocalScheduler`` under AReaL's controller, attached
  to the stand-in server, and fixed there by ``cua_native.engine.capacity`` (the workflow calls
  it on its engine): the configured limits again, as upstream's fix leaves them.
- **#1345** (capacity inflated after a recovery): ``RecoverHandler.load`` sets the rollout's
  version to the recovered step's while ``accepted`` restarts at 0, so the formula allows
  ``version * consumer_batch_size`` samples more than the bound. The ``areal`` 1.0.4 wheel we
  pin already carries the fix (``StalenessManager.on_version_recovered``, called by
  ``PPOTrainer.__init__`` right after ``RecoverHandler.load``; ``CUAPPOTrainer`` keeps that
  ``__init__``). Checked on the controller our path builds: the inflation without the call, the
  bound with it.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from areal.api.io_struct import LocalInfServerInfo
from areal.engine.sglang_remote import RemoteSGLangEngine
from areal.trainer import PPOTrainer

from cua_native.config import load_config
from cua_native.engine.capacity import keep_configured_limits
from cua_native.gym.sim import SimGym
from cua_native.rollout.config import AgentConfig, SamplingConfig
from cua_native.rollout.workflow import CUAAgentWorkflow
from cua_native.training.cluster.attached_engines import AttachedSGLangEngine
from cua_native.training.cluster.local_scheduler import patient_local_scheduler
from cua_native.training.cluster.trainer import CUAPPOTrainer

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "qwen3_vl_android.yaml"
BATCH, CONCURRENT, OFFPOLICY = 4, 64, 2
ACTOR_DP = 4
"""The shipped configs' actor data-parallel size (``fsdp:d4``); the workers' division ignores it."""


class ProbedSGLangEngine(AttachedSGLangEngine):
    """The engine our attach path starts on every rollout worker, plus a reading of its local
    staleness manager and the workflow's fix, called over AReaL's RPC (which can only call
    engine methods)."""

    def keep_configured_limits(self) -> bool:
        return keep_configured_limits(self)

    def staleness_reading(self) -> dict[str, Any]:
        import torch.distributed as dist

        executor = self.workflow_executor
        manager = executor.staleness_manager
        return {
            "process_group": dist.is_initialized(),
            "consumer_batch_size": manager.consumer_batch_size,
            "max_concurrent_rollouts": manager.max_concurrent_rollouts,
            "capacity": executor.get_capacity(),
        }


def bound(version_headroom: int = 0) -> int:
    """The configured capacity with nothing running or accepted yet."""
    return min(CONCURRENT, (OFFPOLICY + version_headroom + 1) * BATCH)


@dataclass
class Rollout:
    controller: Any
    scheduler: Any
    config: Any


@pytest.fixture
def rollout(kit: Any, sk: Any, tmp_path: Path) -> Iterator[Rollout]:
    """AReaL's ``RolloutController`` for a two-server rollout, its workers started by our
    scheduler as on the cluster path's attach mode, both attached to one stand-in server."""
    for sub in ("areal", "name_resolve"):
        (tmp_path / sub).mkdir()
    loaded = load_config(
        CONFIG,
        [
            f"cua.run_dir={tmp_path}",
            "allocation_mode=''",
            "rollout.backend=sglang:d2",
            f"actor.backend=fsdp:d{ACTOR_DP}",
            "scheduler.type=local",
            f"cluster.fileroot={tmp_path / 'areal'}",
            "cluster.name_resolve.type=nfs",
            f"cluster.name_resolve.nfs_record_root={tmp_path / 'name_resolve'}",
            f"train_dataset.batch_size={BATCH}",
            f"rollout.max_concurrent_rollouts={CONCURRENT}",
            f"rollout.max_head_offpolicyness={OFFPOLICY}",
        ],
    )
    config = loaded.areal
    for spec in config.rollout.scheduling_spec:
        spec.gpu = 0
        # the workers import ProbedSGLangEngine from this file
        spec.env_vars = {**dict(spec.env_vars), "PYTHONPATH": str(ROOT)}
    engine = kit.engine()
    scheduler = patient_local_scheduler(config)
    controller = ProbedSGLangEngine.as_controller(config.rollout, scheduler)
    try:
        with sk.serving(engine, "sglang") as srv:
            host, port = srv.addr.rsplit(":", 1)
            info = LocalInfServerInfo(host=host, port=int(port), process=None)
            # what CUAPPOTrainer._init_rollout does when it attaches
            controller.initialize(role="rollout", server_infos=[info, info])
            yield Rollout(controller, scheduler, config)
    finally:
        try:
            if controller.workers:
                controller.destroy()
        finally:
            scheduler.delete_workers()
            engine.destroy()


def readings(rollout: Rollout) -> list[dict[str, Any]]:
    return [
        rollout.scheduler.call_engine(worker.id, "staleness_reading", engine_name=f"rollout/{i}")
        for i, worker in enumerate(rollout.controller.workers)
    ]


@pytest.mark.timeout(900)
def test_rollout_workers_limits_and_recovery(rollout: Rollout) -> None:
    # 1471: every worker keeps half of each limit: the rollout's d2 divides (not the actor's
    # d4, and no process group is involved)
    dp = 2
    divided = {
        "process_group": False,
        "consumer_batch_size": BATCH // dp,
        "max_concurrent_rollouts": CONCURRENT // dp,
        "capacity": min(CONCURRENT // dp, (OFFPOLICY + 1) * (BATCH // dp)),
    }
    assert readings(rollout) == [divided, divided]
    assert rollout.controller.get_capacity() == bound()  # the controller's are the configured
    # the workflow's fix, in each worker: the configured limits, as upstream leaves them
    for i, worker in enumerate(rollout.controller.workers):
        fixed = rollout.scheduler.call_engine(
            worker.id, "keep_configured_limits", engine_name=f"rollout/{i}"
        )
        assert fixed is True
    configured = {
        "process_group": False,
        "consumer_batch_size": BATCH,
        "max_concurrent_rollouts": CONCURRENT,
        "capacity": bound(),
    }
    assert readings(rollout) == [configured, configured]

    # 1345: a recovery to version 5 (RecoverHandler.load sets the version) inflates the
    # controller's capacity by 5 batches; the call PPOTrainer.__init__ makes bounds it
    recovered = 5
    rollout.controller.set_version(recovered)  # the workers get it too
    assert rollout.controller.get_capacity() == bound(version_headroom=recovered)
    rollout.controller.staleness_manager.on_version_recovered(recovered)
    assert rollout.controller.get_capacity() == bound()


async def test_the_workflow_restores_the_limits_of_the_engine_it_is_given(
    kit: Any, sk: Any, tiny: Any
) -> None:
    """A launched server's worker runs AReaL's own ``RemoteSGLangEngine`` (initialized as the
    controller does: no data-parallel size): one episode of the workflow restores its limits."""
    engine = kit.engine()
    gym = SimGym(seed=0)
    agent = AgentConfig(
        family="qwen3_vl",
        model_path=str(tiny.path),
        max_turns=1,
        group_size=1,
        infra_retries=0,
        sampling=SamplingConfig(max_new_tokens=4, greedy=True),
    )
    flow = CUAAgentWorkflow(agent, gym=gym, processor=tiny.processor)
    row = {"task": (await gym.list_tasks())[0].model_dump_json()}
    config = sk.client_config(
        "sglang",
        consumer_batch_size=BATCH,
        max_concurrent_rollouts=CONCURRENT,
        max_head_offpolicyness=OFFPOLICY,
    )
    config.backend = "sglang:d4"
    try:
        with sk.serving(engine, "sglang") as srv:
            client = RemoteSGLangEngine(config)
            client.initialize(engine_id="0", addr=srv.addr)  # the controller's arguments
            try:
                manager = client.workflow_executor.staleness_manager
                assert (manager.consumer_batch_size, manager.max_concurrent_rollouts) == (
                    BATCH // 4,
                    CONCURRENT // 4,
                )
                await flow.arun_episode(client, row)
                assert (manager.consumer_batch_size, manager.max_concurrent_rollouts) == (
                    BATCH,
                    CONCURRENT,
                )
                assert client.workflow_executor.get_capacity() == bound()
            finally:
                client.destroy()
        await flow.aclose()
    finally:
        engine.destroy()


def test_the_trainer_calls_the_recovery_fix_and_ours_keeps_it() -> None:
    """The installed ``PPOTrainer.__init__`` (1.0.4 from PyPI) hands the recovered version to
    the rollout's staleness manager; ``CUAPPOTrainer`` runs that ``__init__`` (``super()``) and
    overrides nothing between recovery and the rollout it recovers."""
    source = inspect.getsource(PPOTrainer.__init__)
    assert "recover_handler.load(" in source
    assert source.index("on_version_recovered(") > source.index("recover_handler.load(")
    assert "super().__init__(config" in inspect.getsource(CUAPPOTrainer.__init__)
