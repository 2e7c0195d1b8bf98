"""AReaL 1.0.4's ``SlurmScheduler`` with the container settings the config states.

AReaL's ``PPOTrainer`` builds ``SlurmScheduler(exp_config=config)``, which reads the experiment's
names, ``cluster.fileroot`` and name resolution from the config but takes its container from
its own defaults: every role's job ran ``apptainer`` with only ``/storage`` bound, whatever the
scheduling specs' ``container_type``, ``mount`` and ``srun_additional_args`` said (AReaL reads
``image`` from the spec). ``slurm_scheduler`` passes the specs' values; the specs must agree on
them (one sbatch script template serves every role), which ``check_slurm_specs`` checks at load
together with what apptainer and the sbatch script need:

- with ``container_type: apptainer`` every shared path (``multinode.shared_paths``) and
  ``cua.run_dir`` must lie under a bound directory, or the workers write inside the container;
- AReaL writes each environment variable into the script as ``--env KEY=VALUE`` unquoted, so a
  value with a blank, a quote or a shell character breaks the ``srun`` line
  (``check_slurm_env``, run on the workers' environment before anything starts).

With ``container_type: none`` AReaL puts no variable in the script: the workers inherit the
environment ``sbatch`` was called with (Slurm's default ``--export=ALL``), which ``run_cluster``
fills with the workers' ``CUA_*`` variables before the trainer starts.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any, NoReturn

from cua_native.config import ConfigError, LoadedConfig
from cua_native.training.cluster.local_scheduler import FORK_READY_TIMEOUT_S
from cua_native.training.cluster.multinode import shared_paths

CONTAINER_FIELDS = ("container_type", "mount", "srun_additional_args")
SAFE_ENV_VALUE = re.compile(r"[A-Za-z0-9_./:@%+,=-]*")
"""What AReaL's unquoted ``--env KEY=VALUE`` carries through the shell unchanged."""


def _fail(field: str, message: str) -> NoReturn:
    raise ConfigError(f"config error: {field}: {message}")


def _specs(config: Any) -> list[tuple[str, Any]]:
    return [
        (f"{part}.scheduling_spec[{i}]", spec)
        for part in ("actor", "rollout")
        for i, spec in enumerate(getattr(config, part).scheduling_spec)
    ]


def bound_directories(mount: str) -> list[str]:
    """The directories inside the container of an apptainer ``--bind`` list
    (``src[:dst[:opts]],...``)."""
    inside = []
    for item in mount.split(","):
        parts = item.strip().split(":")
        if parts[0]:
            inside.append(parts[1] if len(parts) > 1 and parts[1] else parts[0])
    return inside


def check_slurm_specs(loaded: LoadedConfig) -> None:
    """The load-time rules of the module docstring (nothing unless ``scheduler.type: slurm``)."""
    areal = loaded.areal
    if areal.scheduler.type != "slurm":
        return
    specs = _specs(areal)
    first_name, first = specs[0]
    for name, spec in specs[1:]:
        for field in CONTAINER_FIELDS:
            if getattr(spec, field) != getattr(first, field):
                _fail(
                    f"{name}.{field}",
                    f"must equal {first_name}.{field} ({getattr(first, field)!r}): AReaL's "
                    "Slurm scheduler runs every role in one kind of container",
                )
    if first.container_type != "apptainer":
        return
    bound = [PurePosixPath(d) for d in bound_directories(first.mount or "")]
    paths = [*shared_paths(loaded), ("cua.run_dir", str(loaded.cua.run_dir))]
    for field, path in paths:
        pure = PurePosixPath(path)
        if not any(pure == d or d in pure.parents for d in bound):
            _fail(
                field,
                f"{path!r} is not under a directory {first_name}.mount binds into the "
                f"apptainer container ({first.mount!r}); add its storage there",
            )


def check_slurm_env(loaded: LoadedConfig, env: dict[str, str]) -> None:
    """Every variable the sbatch script will carry (``env`` and the specs' ``env_vars``) survives
    AReaL's unquoted ``--env KEY=VALUE`` (apptainer only)."""
    areal = loaded.areal
    if areal.scheduler.type != "slurm":
        return
    specs = _specs(areal)
    if specs[0][1].container_type != "apptainer":
        return
    carried = [("the workers' environment", env)]
    carried += [(f"{name}.env_vars", dict(spec.env_vars)) for name, spec in specs]
    for where, variables in carried:
        for key, value in variables.items():
            if not SAFE_ENV_VALUE.fullmatch(str(value)):
                _fail(
                    f"{where}: {key}",
                    "holds a blank, quote or shell character; AReaL's Slurm scheduler writes "
                    "it unquoted into the srun line (--env KEY=VALUE): use a value without them",
                )


def slurm_scheduler(config: Any) -> Any:
    """AReaL's ``SlurmScheduler`` with the specs' container settings (module docstring) and the
    local scheduler's start-up patience."""
    from areal.infra.scheduler.slurm import SlurmScheduler

    spec = _specs(config)[0][1]
    return SlurmScheduler(
        exp_config=config,
        container_type=spec.container_type,
        container_mounts=spec.mount or None,
        srun_additional_args=spec.srun_additional_args,
        startup_timeout=FORK_READY_TIMEOUT_S,
    )
