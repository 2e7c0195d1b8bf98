"""The recorder of a rollout worker process (AReaL's cluster path).

Workers are separate processes started by AReaL's scheduler, so the trainer cannot hand them a
live recorder; it exports ``CUA_MONITOR_DB`` / ``CUA_MONITOR_URL`` / ``CUA_MONITOR_TOKEN`` /
``CUA_RUN_DIR`` and ``CUA_MONITOR_RUN_NAME`` (the trainer's run name, so the workers' rollouts
land in the trainer's training and steps) and each worker's workflow builds one from them on first use
(``observer_factory="cua_native.monitor.client.worker.observer_from_env"``). The recorder runs on its
own thread, so it never shares the rollout's event loop; records it could not deliver before
the process ends stay in the spill directory and are delivered by the next recorder that opens
the same run directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from cua_native.monitor.client.lifecycle import RUN_NAME_ENV
from cua_native.rollout.records import EpisodeObserver, NullObserver


def observer_from_env() -> EpisodeObserver:
    """A started recorder for this worker, or a ``NullObserver`` when no monitor is configured."""
    db = os.environ.get("CUA_MONITOR_DB")
    url = os.environ.get("CUA_MONITOR_URL")
    if not db and not url:
        return NullObserver()
    from cua_native.monitor.client.recorder import recorder_from_config

    run_root = Path(os.environ.get("CUA_RUN_DIR", "runs/worker"))
    run_dir = run_root / f"worker-{os.getpid()}"
    recorder = recorder_from_config(
        db,
        url,
        os.environ.get("CUA_MONITOR_TOKEN"),
        run_dir,
        run_name=os.environ.get(RUN_NAME_ENV) or run_root.resolve().name,
    )
    recorder.start_in_thread()
    return recorder
