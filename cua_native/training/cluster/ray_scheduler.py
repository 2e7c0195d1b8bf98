"""``PatientRayScheduler``: AReaL 1.0.4's ``RayScheduler`` with two changes, nothing else altered.

- **patience**: AReaL gives a placement group and each new actor's first ping 30 s
  (``startup_timeout``). A Ray actor's first call waits for a fresh Python process to import
  torch and AReaL, which on a loaded machine (a 2-core CI runner, a busy node) takes longer, and
  a cluster that adds nodes on demand takes minutes to place a group. Here they get
  ``FORK_READY_TIMEOUT_S``, as the local scheduler's forked workers do.
- **environment values kept whole**: AReaL joins a scheduling spec's ``env_vars`` into one
  ``K=V,K=V`` string and splits it again (``areal.infra.utils.launcher.get_env_vars``), so a
  value holding ``,`` or ``=`` (a base64 ``CUA_MONITOR_TOKEN``, a database URL with
  ``?sslmode=require``, ``PYTORCH_CUDA_ALLOC_CONF=a:1,b:2``) stops worker creation or reaches the
  worker cut. Here the spec's variables are laid over AReaL's base environment as a mapping;
  precedence is AReaL's (base < spec's ``env_vars``; the thread variables from the spec, the
  environment, then ``cpu``).
"""

from __future__ import annotations

import os
from typing import Any

from areal.infra.scheduler.ray import RayScheduler
from areal.infra.utils.launcher import get_env_vars, get_thread_env_vars
from areal.utils.offload import get_tms_env_vars

from cua_native.config import ConfigError
from cua_native.training.cluster.local_scheduler import FORK_READY_TIMEOUT_S


class PatientRayScheduler(RayScheduler):
    """AReaL's Ray scheduler with patient start-up and whole environment values (see the module
    docstring)."""

    def _build_env_vars(self, spec: Any) -> dict[str, str]:
        env: dict[str, str] = dict(get_env_vars(None))
        env.update({str(k): str(v) for k, v in dict(spec.env_vars or {}).items()})
        if self.enable_tms_offload:
            env.update(get_tms_env_vars())
        env.update(get_thread_env_vars(cpus_per_task=spec.cpu, existing_env_vars=spec.env_vars))
        return env


def connect_ray() -> None:
    """Join the Ray cluster (``RAY_ADDRESS``, else the one ``ray start`` left on this node) unless
    this process already has; no cluster is one ``ConfigError`` line. Called before the trainer
    installs its SIGTERM handler: ``ray.init`` replaces the handler with a bare ``sys.exit``,
    which Ray's waits swallow (``lifecycle.Terminated``). Never starts a one-node cluster in
    place of the one the config was written for."""
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS") or "auto"
    try:
        ray.init(address=address)
    except ConnectionError as error:
        raise ConfigError(
            f"config error: scheduler.type: 'ray' needs a running Ray cluster ({error}); start "
            "one (`ray start --head`, `ray start --address HEAD:6379`) or set RAY_ADDRESS"
        ) from None


def patient_ray_scheduler(config: Any) -> PatientRayScheduler:
    """The scheduler ``CUAPPOTrainer`` runs a Ray job on (the Ray cluster ``ray.init`` or
    ``RAY_ADDRESS`` names; AReaL's first Ray call connects)."""
    return PatientRayScheduler(startup_timeout=FORK_READY_TIMEOUT_S, exp_config=config)
