"""The recorder of a rollout worker process (AReaL's cluster path).

Workers are separate processes started by AReaL's scheduler, so the trainer cannot hand them a
live recorder; it exports ``CUA_MONITOR_DB`` / ``CUA_MONITOR_URL`` / ``CUA_MONITOR_TOKEN`` /
``CUA_RUN_DIR`` and each worker's workflow builds one from them on first use
(``observer_factory="cua_native.monitor.client.worker.observer_from_env"``). The recorder runs on its
own thread, so it never shares the rollout's event loop; records it could not deliver before
the process ends stay in the spill directory and are delivered by the next recorder that opens
the same run directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from cua_native.rollout.records import EpisodeObserver, NullObserver


def observer_from_env() -> EpisodeObserver:
    """A started recorder for this worker, or a ``NullObserver`` when no monitor is configured."""
    db = os.environ.get("CUA_MONITOR_DB")
    url = os.environ.get("CUA_MONITOR_URL")
    if not db and not url:
        return NullObserver()
    from cua_native.monitor.client.recorder import recorder_from_config

    run_dir = Path(os.environ.get("CUA_RUN_DIR", "runs/worker")) / f"worker-{os.getpid()}"
    # the run's name links this worker's episodes to the trainer's training row and steps
    recorder = recorder_from_config(
        db, url, os.environ.get("CUA_MONITOR_TOKEN"), run_dir,
        run_name=os.environ.get("CUA_RUN_NAME") or None,
    )
    recorder.start_in_thread()
    return recorder
