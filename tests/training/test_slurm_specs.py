"""What AReaL 1.0.4's own Slurm scheduler is handed for the multi-node config.

The config goes through what ``run_cluster`` does before the trainer starts (the workers'
environment into the scheduling specs) and what ``CUAPPOTrainer`` does to make the scheduler
(``slurm_scheduler``); AReaL's ``SlurmScheduler.create_workers`` then builds each role's sbatch
script with its own code and submits it. ``sbatch`` is the one part replaced: a script on
``PATH`` that keeps the submitted file and answers as Slurm does. The submitted scripts are read
back, and their ``srun`` line is split the way the shell will split it, so the ``CUA_*``
variables are shown to arrive whole.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from cua_native.config import ConfigError, LoadedConfig, load_config
from cua_native.training.cluster.checks import check_cluster_config
from cua_native.training.cluster.run import apply_worker_env, worker_env
from cua_native.training.cluster.slurm_scheduler import (
    bound_directories,
    check_slurm_env,
    check_slurm_specs,
    slurm_scheduler,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MULTINODE = CONFIGS / "qwen3_vl_android_multinode.yaml"
FAKE_SBATCH = """#!/bin/sh
# Slurm's sbatch, as far as AReaL reads it: keep the script, print the job id
n=$(ls "$SUBMITTED" | wc -l)
cp "$1" "$SUBMITTED/$n.sh"
echo "Submitted batch job $((1000 + n))"
"""


def _config(shared: Path, container: str = "apptainer") -> LoadedConfig:
    loaded = load_config(
        MULTINODE,
        [
            "scheduler.type=slurm",
            f"cluster.fileroot={shared}/areal",
            f"cluster.name_resolve.nfs_record_root={shared}/areal/name_resolve",
            f"cua.run_dir={shared}/runs/multinode",
            "cua.monitor_token=tok+en/with=padding==",
        ],
    )
    for spec in [*loaded.areal.actor.scheduling_spec, *loaded.areal.rollout.scheduling_spec]:
        spec.container_type = container
        spec.mount = f"{shared}:{shared},/models:/models"
        spec.image = f"{shared}/images/areal.sif"
    return loaded


def _submit(loaded: LoadedConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Both roles' jobs, built and submitted by AReaL's scheduler; the scripts it submitted."""
    from areal.api import Job
    from areal.api.alloc_mode import ModelAllocation

    areal = loaded.areal
    for sub in ("areal/name_resolve", "runs/multinode"):
        (tmp_path / "shared" / sub).mkdir(parents=True, exist_ok=True)
    bin_dir, submitted = tmp_path / "bin", tmp_path / "submitted"
    bin_dir.mkdir()
    submitted.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("SUBMITTED", str(submitted))

    env = worker_env(loaded)  # what run_cluster does before the trainer starts
    check_slurm_env(loaded, env)
    apply_worker_env(loaded, env)
    scheduler = slurm_scheduler(areal)  # what CUAPPOTrainer._init_scheduler returns
    # the jobs AReaL's TrainController and RolloutController ask for (one engine per GPU here)
    actor = ModelAllocation.from_str(areal.actor.backend, name="actor").parallel.world_size
    rollout = ModelAllocation.from_str(areal.rollout.backend, name="rollout").parallel.dp_size
    jobs = [
        Job(
            replicas=actor,
            tasks=list(areal.actor.scheduling_spec),
            scheduling_strategy=areal.actor.scheduling_strategy,
            role="actor",
        ),
        Job(
            replicas=rollout,
            tasks=[areal.rollout.scheduling_spec[0]] * rollout,
            scheduling_strategy=areal.rollout.scheduling_strategy,
            role="rollout",
        ),
    ]
    for job in jobs:
        assert scheduler.create_workers(job=job) == [f"{job.role}/{i}" for i in range(8)]
    return [(submitted / f"{n}.sh").read_text() for n in range(len(jobs))]


def _srun_words(script: str) -> list[str]:
    """The ``srun`` command of the script as the shell splits it (its output pipeline cut)."""
    body = "\n".join(line for line in script.splitlines() if not line.startswith("#"))
    start = body.index("srun ")
    end = body.index(" 2>&1 | tee", start)
    return shlex.split(body[start:end])


def _env_of(words: list[str]) -> dict[str, str]:
    pairs = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--env"]
    return dict(pair.split("=", 1) for pair in pairs)


def test_each_role_is_one_slurm_job_on_its_own_node_with_the_cua_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    loaded = _config(shared)
    check_slurm_specs(loaded)
    env = worker_env(loaded)
    assert {"CUA_RUN_DIR", "CUA_MONITOR_RUN_NAME", "CUA_MONITOR_URL", "CUA_MONITOR_TOKEN"} <= set(
        env
    )
    actor_script, rollout_script = _submit(loaded, tmp_path, monkeypatch)
    for role, script in (("actor", actor_script), ("rollout", rollout_script)):
        # eight one-GPU tasks on one whole 8-GPU node: the two roles take two nodes
        assert f"#SBATCH --job-name=cua-qwen3-vl-android-multinode_run1:{role}" in script
        for option in ("--nodes=1", "--ntasks-per-node=8", "--gres=gpu:8", "--cpus-per-task=8"):
            assert f"#SBATCH {option}" in script, script
        words = _srun_words(script)
        # the container the config states, not AReaL's default (/storage bound)
        assert words[words.index("--bind") + 1] == f"{shared}:{shared},/models:/models"
        assert f"{shared}/images/areal.sif" in words
        # every CUA_* variable arrives whole after the shell splits the line, the token's
        # '+', '/' and '=' included
        carried = _env_of(words)
        for key, value in env.items():
            assert carried[key] == value, key
        # AReaL's worker command: the shared name resolution and fileroot
        command = words[-1]
        assert f"--role {role}" in command
        assert f"--nfs-record-root {shared}/areal/name_resolve" in command
        assert f"--fileroot {shared}/areal" in command
    # the rollout workers' own variable (which backend the weight-update group uses) is only
    # in their job when the run attaches to servers (CUAPPOTrainer adds it then)
    assert "CUA_WEIGHT_UPDATE_BACKEND" not in actor_script


def test_without_a_container_the_workers_inherit_the_submitting_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = _config(tmp_path / "shared", container="none")
    check_slurm_specs(loaded)  # no bind needed
    for script in _submit(loaded, tmp_path, monkeypatch):
        words = _srun_words(script)
        # AReaL writes no variable into a native job's script: sbatch exports the caller's
        # environment (Slurm's default), which run_cluster fills with worker_env first
        assert "singularity" not in words and "--env" not in words
        assert "CUA_" not in script
        assert words[words.index("srun") + 1 :][:1] == ["--unbuffered"]


def test_areal_alone_would_bind_only_storage(tmp_path: Path) -> None:
    """The seam ``slurm_scheduler`` closes: ``SlurmScheduler(exp_config=...)`` as AReaL's
    ``PPOTrainer`` makes it takes apptainer with ``/storage`` bound, whatever the specs say."""
    from areal.infra.scheduler.slurm import SlurmScheduler

    shared = tmp_path / "shared"
    (shared / "areal" / "name_resolve").mkdir(parents=True)
    loaded = _config(shared, container="none")
    plain = SlurmScheduler(exp_config=loaded.areal)
    assert (plain.container_type, plain.container_mounts) == ("apptainer", "/storage:/storage")
    ours = slurm_scheduler(loaded.areal)
    assert (ours.container_type, ours.container_mounts) == (
        "none",
        f"{shared}:{shared},/models:/models",
    )


def test_specs_must_agree_and_bind_the_shared_paths(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    loaded = _config(shared)
    loaded.areal.rollout.scheduling_spec[0].container_type = "none"
    with pytest.raises(
        ConfigError, match=r"^config error: rollout.scheduling_spec\[0\].container_type: must equal"
    ):
        check_slurm_specs(loaded)
    loaded = _config(shared)
    for spec in [*loaded.areal.actor.scheduling_spec, *loaded.areal.rollout.scheduling_spec]:
        spec.mount = "/storage:/storage"
    with pytest.raises(ConfigError, match=r"^config error: cluster.fileroot: .* not under"):
        check_slurm_specs(loaded)
    # the shipped config binds its shared paths, so it runs on Slurm by one override
    check_cluster_config(load_config(MULTINODE, ["scheduler.type=slurm"]))


def test_an_environment_value_the_srun_line_would_split_is_refused(tmp_path: Path) -> None:
    loaded = _config(tmp_path / "shared")
    env = worker_env(loaded)
    check_slurm_env(loaded, env)
    with pytest.raises(
        ConfigError, match=r"^config error: the workers' environment: CUA_MONITOR_TOKEN: holds"
    ):
        check_slurm_env(loaded, {**env, "CUA_MONITOR_TOKEN": "two words"})
    loaded.areal.actor.scheduling_spec[0].env_vars = {"X": "$(reboot)"}
    with pytest.raises(
        ConfigError, match=r"^config error: actor.scheduling_spec\[0\].env_vars: X:"
    ):
        check_slurm_env(loaded, env)
    # without a container nothing is written into the script
    native = _config(tmp_path / "shared", container="none")
    check_slurm_env(native, {**env, "CUA_MONITOR_TOKEN": "two words"})


def test_bound_directories() -> None:
    assert bound_directories("/storage:/storage") == ["/storage"]
    assert bound_directories("/a:/b:ro,/c") == ["/b", "/c"]
    assert bound_directories("") == []
