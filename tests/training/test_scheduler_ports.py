"""Two runs of one seed on one machine get different worker ports (issue 12).

AReaL's ``LocalScheduler`` draws ports from the global ``random`` that ``PPOTrainer`` has just
seeded with ``config.seed``; ``PatientLocalScheduler`` draws them from fresh entropy and leaves
the run's random stream as it was.
"""

from __future__ import annotations

import random
from pathlib import Path

from areal.infra import LocalScheduler

from cua_native.training.areal_trainer import PatientLocalScheduler


def _scheduler(cls: type, root: Path) -> LocalScheduler:
    (root / "nr").mkdir(parents=True, exist_ok=True)
    return cls(
        gpu_devices=[0], log_dir=str(root / "logs"), experiment_name="e", trial_name="t",
        fileroot=str(root), nfs_record_root=str(root / "nr"),
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
