"""Controller-managed rollout workers keep the configured staleness limits (AReaL #1471).

On the cluster path (AReaL's single-controller mode) AReaL 1.0.4's ``RolloutController`` gates
every submission with one global ``StalenessManager`` (``rollout.max_concurrent_rollouts``,
``rollout.consumer_batch_size``, ``rollout.max_head_offpolicyness``) and hands the tasks
round-robin to one rollout worker per inference server. Each worker's ``RemoteInfEngine`` runs a
second, local manager, and ``RemoteSGLangEngine``/``RemotevLLMEngine.initialize``, given no
``train_data_parallel_size`` (the controller gives none), divides that manager's
``max_concurrent_rollouts`` and ``consumer_batch_size`` by the rollout's data-parallel size
(``sglang:d4``: a quarter of each). The quarters bind: a worker at its local limit holds the
task the controller just admitted while other workers idle, and with small batches a worker's
limit reaches nothing and rollouts stall. Upstream fixed it after 1.0.4 (inclusionAI/AReaL PR
#1471) by having the controller pass ``train_data_parallel_size=1``: the controller alone
limits, the workers never re-scale.

Our trainer cannot pass it on every path (AReaL's ``PPOTrainer._init_rollout`` builds the
controller of launched servers), so the worker restores its own limits:
``keep_configured_limits(engine)``, which the workflow calls on the engine a rollout worker hands
it, sets the local manager's two limits back to the configured values (the executor keeps
them). Only in single-controller mode: under AReaL's SPMD launcher every trainer rank owns a
rollout engine and its share of the limits, which is right there. Idempotent; any other engine
is left untouched.
"""

from __future__ import annotations

from typing import Any

from areal.infra.remote_inf_engine import RemoteInfEngine
from areal.utils.environ import is_single_controller


def keep_configured_limits(engine: Any) -> bool:
    """Undo the data-parallel division of a controller-managed worker's local staleness limits;
    True if ``engine`` is such a worker's initialized AReaL remote engine."""
    if not is_single_controller():
        return False
    inner = getattr(engine, "_engine", engine)  # Remote{SGLang,vLLM}Engine wrap a RemoteInfEngine
    if not isinstance(inner, RemoteInfEngine) or not inner.initialized:
        return False
    executor = inner.workflow_executor
    manager = executor.staleness_manager
    with manager.lock:
        manager.max_concurrent_rollouts = executor.max_concurrent_rollouts
        manager.consumer_batch_size = executor.consumer_batch_size
    return True
