"""The checks of a run across nodes (``cua_native.training.cluster.multinode``): with AReaL's Ray or Slurm
scheduler every loopback address, node-local path and single-host store is one error naming its
field; the local scheduler and a rehearsal on one host are left alone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from cua_native.config import ConfigError, load_config
from cua_native.training.cluster.checks import check_cluster_config
from cua_native.training.cluster.multinode import check_shared_storage, is_loopback_host
from cua_native.training.cluster.run import check_attach

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MULTINODE = CONFIGS / "qwen3_vl_android_multinode.yaml"


def _error(overrides: list[str]) -> str:
    loaded = load_config(MULTINODE, overrides)
    with pytest.raises(ConfigError) as info:
        check_cluster_config(loaded)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_the_multinode_config_passes_and_is_on_ray() -> None:
    loaded = load_config(MULTINODE)
    check_cluster_config(loaded)
    areal = loaded.areal
    assert areal.scheduler.type == "ray"
    assert areal.cluster.n_nodes >= 2
    # the actor's eight ranks fill a node together, each server has its own group: Ray puts
    # the two roles on different nodes
    assert areal.actor.backend == "fsdp:d8" and areal.rollout.backend == "sglang:d8"
    assert areal.cluster.n_gpus_per_node == 8
    assert [s.ray_placement_strategy for s in areal.actor.scheduling_spec] == ["shared"]
    assert [s.ray_placement_strategy for s in areal.rollout.scheduling_spec] == ["separate"]
    assert loaded.cua.monitor_db is None and loaded.cua.monitor_url


@pytest.mark.parametrize("scheduler", ["ray", "slurm"])
@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("cua.agent.gym.base_url=http://127.0.0.1:8080", "cua.agent.gym.base_url"),
        ("cua.agent.gym.base_url=http://localhost:8080", "cua.agent.gym.base_url"),
        ("cua.agent.gym.base_url=http://[::1]:8080", "cua.agent.gym.base_url"),
        ("cua.monitor_url=http://0.0.0.0:3000", "cua.monitor_url"),
        ("cua.monitor_db=sqlite", "cua.monitor_db"),
        ("cua.monitor_db=sqlite:////shared/monitor.db", "cua.monitor_db"),
        ("cua.monitor_db=postgresql://u@localhost/cua", "cua.monitor_db"),
        ("cluster.fileroot=/tmp/areal", "cluster.fileroot"),
        ("cluster.fileroot=/dev/shm/areal", "cluster.fileroot"),
        ("cluster.fileroot=areal", "cluster.fileroot"),
        ("cua.run_dir=runs/x", "saver.fileroot"),
        ("cua.run_dir=/var/tmp/x", "saver.fileroot"),
        ("recover.fileroot=/run/areal", "recover.fileroot"),
        (
            "cluster.name_resolve.nfs_record_root=/tmp/areal/name_resolve",
            "cluster.name_resolve.nfs_record_root",
        ),
        (
            "cluster.name_resolve.type=etcd3",  # AReaL's default etcd3_addr is localhost:2379
            "cluster.name_resolve.etcd3_addr",
        ),
    ],
)
def test_each_multinode_rule_names_its_field(scheduler: str, override: str, field: str) -> None:
    message = _error([f"scheduler.type={scheduler}", override])
    assert message.startswith(f"config error: {field}"), message


def test_ray_name_resolution_needs_the_ray_scheduler() -> None:
    loaded = load_config(MULTINODE, ["cluster.name_resolve.type=ray"])
    check_cluster_config(loaded)  # one Ray cluster spans the nodes
    message = _error(["scheduler.type=slurm", "cluster.name_resolve.type=ray"])
    assert message.startswith("config error: cluster.name_resolve.type:"), message
    check_cluster_config(
        load_config(
            MULTINODE,
            [
                "cluster.name_resolve.type=etcd3",
                "cluster.name_resolve.etcd3_addr=etcd.internal:2379",
            ],
        )
    )


def test_the_local_scheduler_and_a_one_host_run_are_left_alone() -> None:
    loopback = ["cua.agent.gym.base_url=http://127.0.0.1:8080", "cluster.fileroot=/tmp/areal"]
    check_cluster_config(load_config(MULTINODE, ["scheduler.type=local", *loopback]))
    check_cluster_config(load_config(MULTINODE, loopback), one_host=True)
    for name in ("qwen3_vl_android.yaml", "mai_ui_android.yaml"):
        check_cluster_config(load_config(CONFIGS / name))


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("app.localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", True),
        ("10.0.0.5", False),
        ("192.0.2.2", False),
        ("genv.internal", False),
        ("fe80::1", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_attached_servers_must_not_be_loopback_across_nodes() -> None:
    loaded = load_config(MULTINODE)
    check_attach(loaded, ["10.0.0.5:30000"])
    with pytest.raises(ConfigError, match=r"^config error: AREAL_LLM_SERVER_ADDRS: '127.0.0.1:"):
        check_attach(loaded, ["10.0.0.5:30000", "127.0.0.1:30001"])
    check_attach(load_config(MULTINODE, ["scheduler.type=local"]), ["127.0.0.1:30001"])


@dataclass
class _Mount:
    mountpoint: str
    fstype: str


def _storage(*, fileroot: Path, run_dir: Path) -> list[str]:
    return [
        f"cluster.fileroot={fileroot}",
        f"cluster.name_resolve.nfs_record_root={fileroot}/name_resolve",
        f"cua.run_dir={run_dir}",
    ]


def test_shared_storage_must_exist_where_the_trainer_starts(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    loaded = load_config(MULTINODE, _storage(fileroot=shared / "areal", run_dir=shared / "run"))
    nfs = [_Mount("/", "ext4"), _Mount(str(shared), "nfs4")]
    with pytest.raises(ConfigError, match=r"^config error: cluster.fileroot: .* does not exist"):
        check_shared_storage(loaded, nfs)
    for sub in ("areal/name_resolve", "run/areal"):
        (shared / sub).mkdir(parents=True)
    check_shared_storage(loaded, nfs)
    # the same directories on this host's own disk, in memory, or in a container's root
    for local in ("ext4", "xfs", "tmpfs", "overlay"):
        with pytest.raises(ConfigError, match=rf"^config error: cluster.fileroot: .*\({local}\)"):
            check_shared_storage(loaded, [_Mount("/", "nfs"), _Mount(str(tmp_path), local)])
    # a cluster filesystem mounted through FUSE, and Lustre, pass
    check_shared_storage(loaded, [_Mount("/", "ext4"), _Mount(str(shared), "fuse.juicefs")])
    check_shared_storage(loaded, [_Mount("/", "ext4"), _Mount(str(tmp_path), "lustre")])


def test_the_longest_mount_decides(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "areal" / "name_resolve").mkdir(parents=True)
    (shared / "run" / "areal").mkdir(parents=True)
    loaded = load_config(MULTINODE, _storage(fileroot=shared / "areal", run_dir=shared / "run"))
    # a local disk mounted at a sibling whose name shares the prefix does not count
    mounts = [_Mount("/", "nfs"), _Mount(f"{shared}2", "ext4"), _Mount(str(tmp_path), "nfs")]
    check_shared_storage(loaded, mounts)
    with pytest.raises(ConfigError, match=r"^config error: saver.fileroot"):
        check_shared_storage(loaded, [*mounts, _Mount(str(shared / "run"), "xfs")])


def test_storage_of_a_local_run_is_not_checked(tmp_path: Path) -> None:
    loaded = load_config(MULTINODE, ["scheduler.type=local"])
    check_shared_storage(loaded, [_Mount("/", "ext4")])  # /shared/areal need not exist here
