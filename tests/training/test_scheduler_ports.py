"""Two runs of one seed on one machine get different worker ports (issues 12 and 15).

AReaL's ``LocalScheduler`` draws ports from the global ``random`` that ``PPOTrainer`` has just
seeded with ``config.seed``, and a forked worker's port from its parent guard's ``random``,
seeded with the same seed; ``PatientLocalScheduler`` draws both from fresh entropy and leaves
the run's random stream as it was. The fork tests run AReaL's own ``_fork_single_worker``
against a guard that answers as AReaL's does (``find_free_ports`` on a seeded ``random``).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import TracebackType
from typing import Any

from areal.api.scheduler_api import Worker
from areal.infra import LocalScheduler
from areal.infra.scheduler.local import WorkerInfo
from areal.utils.network import find_free_ports

from cua_native.training.cluster.local_scheduler import PatientLocalScheduler


def _scheduler(cls: type, root: Path) -> LocalScheduler:
    (root / "nr").mkdir(parents=True, exist_ok=True)
    return cls(
        gpu_devices=[0],
        log_dir=str(root / "logs"),
        experiment_name="e",
        trial_name="t",
        fileroot=str(root),
        nfs_record_root=str(root / "nr"),
    )


def test_areal_alone_repeats_the_seeded_ports(tmp_path: Path) -> None:
    picked = []
    for run in ("a", "b"):
        random.seed(1)
        picked.append(_scheduler(LocalScheduler, tmp_path / run)._allocate_ports(4))
    assert picked[0] == picked[1]  # the collision this scheduler avoids


def test_same_seed_runs_get_different_ports(tmp_path: Path) -> None:
    picked = []
    for run in ("a", "b"):
        random.seed(1)
        picked.append(_scheduler(PatientLocalScheduler, tmp_path / run)._allocate_ports(4))
    # four ports each, drawn from ~22,000: equal lists only by a 1-in-10^17 chance
    assert picked[0] != picked[1]


def test_the_run_random_stream_is_untouched(tmp_path: Path) -> None:
    random.seed(7)
    expected = random.random()
    random.seed(7)
    _scheduler(PatientLocalScheduler, tmp_path)._allocate_ports(3)
    assert random.random() == expected


class _Reply:
    def __init__(self, body: dict[str, Any]) -> None:
        self.status = 200
        self._body = body

    async def json(self) -> dict[str, Any]:
        return self._body

    async def __aenter__(self) -> _Reply:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


class _SeededGuard:
    """A parent worker's guard as AReaL runs it: ``/alloc_ports`` draws from a ``random`` seeded
    with the run's seed (``/configure``), ``/fork`` records the command it was given."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.forked: list[list[str]] = []

    def post(self, url: str, json: dict[str, Any]) -> _Reply:
        if url.endswith("/alloc_ports"):
            state = random.getstate()
            random.seed(self.seed)
            try:
                ports = find_free_ports(json["count"])
            finally:
                random.setstate(state)
            return _Reply({"status": "success", "ports": ports, "host": "127.0.0.1"})
        assert url.endswith("/fork"), url
        self.forked.append(json["raw_cmd"])
        return _Reply({"status": "success", "pid": 4242})

    def get(self, url: str, timeout: Any = None) -> _Reply:
        return _Reply({"status": "ok"})


def _forked_port(cls: type, root: Path) -> int:
    scheduler = _scheduler(cls, root)
    guard = _SeededGuard(seed=1)
    parent = WorkerInfo(
        worker=Worker(id="rollout/0", ip="127.0.0.1", worker_ports=["1"], engine_ports=[]),
        process=None,
        role="rollout",
        gpu_devices=[],
        created_at=0.0,
        log_file="rollout.log",
    )
    scheduler._workers["rollout"] = [parent]  # the fork reads the parent's port count
    try:
        asyncio.run(scheduler._fork_single_worker(guard, "eval-rollout", 0, parent, "rollout"))
    finally:
        del scheduler._workers["rollout"]  # nothing was started: nothing for the scheduler to stop
    (command,) = guard.forked
    return int(command[command.index("--port") + 1])


def test_areal_alone_forks_same_seed_runs_on_one_port(tmp_path: Path) -> None:
    ports = {_forked_port(LocalScheduler, tmp_path / run) for run in ("a", "b")}
    assert len(ports) == 1  # the eval-rollout collision seen in a loaded suite run


def test_same_seed_runs_fork_on_different_ports(tmp_path: Path) -> None:
    ports = [_forked_port(PatientLocalScheduler, tmp_path / run) for run in ("a", "b", "c")]
    # three draws from ~22,000 ports: a repeat only by a ~1-in-7,000 chance
    assert len(set(ports)) == 3


def test_a_scheduler_never_gives_a_port_twice(tmp_path: Path) -> None:
    scheduler = _scheduler(PatientLocalScheduler, tmp_path)
    first, second = scheduler._allocate_ports(50), scheduler._allocate_ports(50)
    assert len(set(first) | set(second)) == 100
    assert all(10000 <= p <= 32767 for p in first + second)
