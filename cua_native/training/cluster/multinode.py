"""What a cluster run on more than one node needs (``scheduler.type`` ``ray`` or ``slurm``).

With AReaL's Ray or Slurm scheduler the FSDP actor and the rollout workers run on other hosts
than the trainer. Each rule below is a way such a run breaks although it works on one node; each
failure is one ``ConfigError`` naming the field, raised before anything slow starts:

- **reachable from every node**: the gym server (``cua.agent.gym.base_url``), the Training
  Monitor (``cua.monitor_url``) and its database (``cua.monitor_db``) are contacted by the
  rollout workers, so a loopback host (``127.0.0.1``, ``localhost``, ``::1``, ``0.0.0.0``) names
  a different machine on each node; a SQLite file is a store of one host (SQLite over a network
  filesystem is unsafe), so a run across nodes records to a monitor URL or a database server;
- **shared by every node**: ``cluster.fileroot`` (disk weight updates, logs), ``saver.fileroot``
  and ``recover.fileroot`` (checkpoints the actor's ranks write and the trainer reads) must be
  absolute paths (a relative one resolves against each worker's working directory, which Ray
  and Slurm set) outside the node-local roots (``NODE_LOCAL_ROOTS``);
- **name resolution across nodes** (``cluster.name_resolve``): AReaL finds servers and workers
  through it. ``nfs`` needs its ``nfs_record_root`` on shared storage (the rule above);
  ``etcd3`` an etcd that is not on loopback; ``ray`` (a detached Ray actor) needs one Ray cluster
  spanning the nodes, which only the Ray scheduler has.

``check_shared_storage`` is the launch-time half, run where the trainer starts (the cluster's
paths do not exist on a laptop, where the same config is rehearsed): the shared paths must exist
and must not lie on a filesystem that is positively node-local (``LOCAL_FILESYSTEMS``: a block
device's ext4/xfs/btrfs cannot be mounted by two hosts at once; ``tmpfs`` and ``overlay`` live
in one host's memory or container). Network and cluster filesystems (NFS, Lustre, GPFS, CephFS,
FUSE mounts, ...) pass. AReaL itself only warns about a non-network ``fileroot``, and only for
the Slurm and local schedulers (``areal.utils.fs.validate_shared_path``).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any, NoReturn, Protocol
from urllib.parse import urlsplit

from cua_native.config import ConfigError, LoadedConfig

MULTI_NODE_SCHEDULERS = ("ray", "slurm")
NODE_LOCAL_ROOTS = ("/tmp", "/var/tmp", "/dev/shm", "/run")
"""Directories every host has its own of (FHS: temporary files, memory-backed runtime data)."""
LOCAL_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "vfat", "tmpfs", "ramfs", "overlay"}
)
"""Filesystem types one host alone mounts: block-device filesystems (no concurrent mounts by
two hosts), memory filesystems and a container's overlay root."""
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class Partition(Protocol):
    """What ``check_shared_storage`` reads of a mount (``psutil.disk_partitions``' entries)."""

    mountpoint: str
    fstype: str


def _fail(field: str, message: str) -> NoReturn:
    raise ConfigError(f"config error: {field}: {message}")


def spans_nodes(loaded: LoadedConfig) -> bool:
    """Whether the config's scheduler may place workers on other hosts than the trainer's."""
    return str(loaded.areal.scheduler.type) in MULTI_NODE_SCHEDULERS


def is_loopback_host(host: str) -> bool:
    """``host`` (a name or an address literal) means "this machine" on whichever host reads
    it. Names are not resolved (a cluster's names may resolve only on the cluster)."""
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _url_host(url: str) -> str:
    return urlsplit(url).hostname or ""


def _check_reachable(field: str, url: str | None, scheduler: str) -> None:
    if url and is_loopback_host(_url_host(url)):
        _fail(
            field,
            f"{url!r} is a loopback address, which names a different host on every node "
            f"(scheduler.type {scheduler!r}); give an address every node reaches",
        )


FOLLOWS = {
    "saver.fileroot": " (it follows cua.run_dir unless set)",
    "recover.fileroot": " (it follows cua.run_dir unless set)",
}
"""Where a path field's default comes from (``config.BASE_LAYER``), named in its error."""


def _check_shared_path(field: str, path: str, scheduler: str) -> None:
    field = f"{field}{FOLLOWS.get(field, '')}"
    pure = PurePosixPath(path)
    if not pure.is_absolute():
        _fail(
            field,
            f"{path!r} is relative; with scheduler.type {scheduler!r} workers run in other "
            "working directories: give an absolute path on storage every node mounts",
        )
    for root in NODE_LOCAL_ROOTS:
        if pure == PurePosixPath(root) or PurePosixPath(root) in pure.parents:
            _fail(
                field,
                f"{path!r} is under {root}, which every host has its own of; with "
                f"scheduler.type {scheduler!r} it must be on storage every node mounts",
            )


def shared_paths(loaded: LoadedConfig) -> list[tuple[str, str]]:
    """``(field, path)`` of every directory the nodes must share."""
    areal = loaded.areal
    paths = [
        ("cluster.fileroot", str(areal.cluster.fileroot)),
        ("saver.fileroot", str(areal.saver.fileroot)),
        ("recover.fileroot", str(areal.recover.fileroot)),
    ]
    if areal.cluster.name_resolve.type == "nfs":
        paths.append(
            (
                "cluster.name_resolve.nfs_record_root",
                str(areal.cluster.name_resolve.nfs_record_root),
            )
        )
    return paths


def check_multinode_config(loaded: LoadedConfig) -> None:
    """The load-time rules of the module docstring; nothing for the local scheduler."""
    if not spans_nodes(loaded):
        return
    areal, cua = loaded.areal, loaded.cua
    scheduler = str(areal.scheduler.type)
    _check_reachable("cua.agent.gym.base_url", cua.agent.gym.base_url, scheduler)
    _check_reachable("cua.monitor_url", cua.monitor_url, scheduler)
    db = cua.monitor_db_url()
    if db and db.startswith("sqlite"):
        _fail(
            "cua.monitor_db",
            f"a SQLite file is one host's store; with scheduler.type {scheduler!r} the rollout "
            "workers on other nodes record to it: set cua.monitor_url (a Training Monitor) or "
            "a database server's URL, or monitor_db: null",
        )
    if db:
        _check_reachable("cua.monitor_db", db, scheduler)
    for field, path in shared_paths(loaded):
        _check_shared_path(field, path, scheduler)
    resolve = areal.cluster.name_resolve
    if resolve.type == "etcd3":
        host = resolve.etcd3_addr.rsplit(":", 1)[0]
        if is_loopback_host(host):
            _fail(
                "cluster.name_resolve.etcd3_addr",
                f"{resolve.etcd3_addr!r} is a loopback address: every node would ask its own "
                "etcd; give the address of one etcd every node reaches",
            )
    elif resolve.type == "ray" and scheduler != "ray":
        _fail(
            "cluster.name_resolve.type",
            f"'ray' keeps names in a Ray actor, which only a Ray cluster spanning the nodes "
            f"shares; with scheduler.type {scheduler!r} use 'nfs' (on shared storage) or 'etcd3'",
        )


def _mount_of(path: str, partitions: Iterable[Partition]) -> Partition | None:
    best: Partition | None = None
    for partition in partitions:
        mount = partition.mountpoint.rstrip("/") or "/"
        inside = path == mount or path.startswith(mount if mount == "/" else mount + "/")
        if inside and (best is None or len(mount) > len(best.mountpoint.rstrip("/") or "/")):
            best = partition
    return best


def check_shared_storage(
    loaded: LoadedConfig, partitions: Iterable[Partition] | None = None
) -> None:
    """Launch-time: every shared path (``shared_paths``) exists on this host and does not lie on
    a node-local filesystem (``partitions``: default ``psutil.disk_partitions(all=True)``)."""
    if not spans_nodes(loaded):
        return
    if partitions is None:
        import psutil

        partitions = psutil.disk_partitions(all=True)
    mounts: list[Any] = list(partitions)
    for field, path in shared_paths(loaded):
        if not os.path.isdir(path):
            _fail(
                field,
                f"{path!r} does not exist on this host; mount the storage every node shares "
                "here (and on every node) before launching",
            )
        mount = _mount_of(os.path.realpath(path), mounts)
        if mount is not None and mount.fstype.lower() in LOCAL_FILESYSTEMS:
            _fail(
                field,
                f"{path!r} lies on {mount.mountpoint} ({mount.fstype}), a filesystem only this "
                "host mounts; put it on storage every node mounts (NFS, Lustre, CephFS, ...)",
            )
