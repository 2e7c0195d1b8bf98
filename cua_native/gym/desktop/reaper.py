"""What a local desktop leaves on the machine, and how to remove it on every path.

A desktop lives in a state directory ``<root>/<owner pid>-<owner start time>-<id>``; every
process started for it (Xvfb, window manager, server, and every app those start) carries
``CUA_DESKTOP_ID=<directory name>`` in its environment, so processes that double-fork or start
their own session are found too. ``remove_desktop`` kills them all, removes the X display's lock
and socket if the killed Xvfb left them, and deletes the directory. ``reap_stale`` does that for
every directory whose owner process is gone (a trainer killed with ``kill -9``), so the next
start cleans what an earlier one left. Blocking (``/proc`` scans, signals, rmtree): call it in a
worker thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)

MARKER = "CUA_DESKTOP_ID"
X_LOCK = "/tmp/.X{n}-lock"
X_SOCKET = "/tmp/.X11-unix/X{n}"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, ``None`` if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def owner_alive(name: str) -> bool:
    """Whether the process that created state directory ``name`` still runs (same pid and start
    time, so a reused pid does not count)."""
    try:
        pid_text, started_text, _ = name.split("-", 2)
        pid, started = int(pid_text), int(started_text)
    except ValueError:
        return False
    return start_time(pid) == started


def marked_pids(desktop_id: str) -> list[int]:
    """Processes whose environment carries this desktop's marker (zombies have none)."""
    needle = f"{MARKER}={desktop_id}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill_marked(
    desktop_id: str, *, keep: frozenset[int] = frozenset(), limit_s: float = 10.0
) -> None:
    """SIGKILL every marked process except ``keep``, until none is left (bounded)."""
    deadline = time.monotonic() + limit_s
    while True:
        pids = [p for p in marked_pids(desktop_id) if p not in keep]
        if not pids:
            return
        if time.monotonic() > deadline:
            log.warning("desktop %s: processes %s survived SIGKILL", desktop_id, pids)
            return
        _signal(pids, signal.SIGKILL)
        time.sleep(0.05)


def stop_xvfb(pid: int, *, limit_s: float = 5.0) -> None:
    """SIGTERM (so Xvfb removes its lock and socket), then SIGKILL after ``limit_s``."""
    _signal([pid], signal.SIGTERM)
    deadline = time.monotonic() + limit_s
    while start_time(pid) is not None and not _is_zombie(pid):
        if time.monotonic() > deadline:
            _signal([pid], signal.SIGKILL)
            return
        time.sleep(0.02)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2 :].startswith("Z")


def remove_display_files(display: int) -> None:
    """Remove display ``display``'s lock and socket unless a live process holds the lock."""
    lock = Path(X_LOCK.format(n=display))
    try:
        holder = int(lock.read_text().strip())
    except (OSError, ValueError):
        holder = None
    if holder is not None and start_time(holder) is not None and not _is_zombie(holder):
        return
    for path in (lock, Path(X_SOCKET.format(n=display))):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_desktop(state_dir: Path, *, xvfb_pid: int | None = None) -> None:
    """Kill every process of the desktop in ``state_dir``, its display files, the directory."""
    desktop_id = state_dir.name
    keep = frozenset() if xvfb_pid is None else frozenset({xvfb_pid})
    kill_marked(desktop_id, keep=keep)
    if xvfb_pid is not None:
        stop_xvfb(xvfb_pid)
        kill_marked(desktop_id)
    display_file = state_dir / "display"
    with contextlib.suppress(OSError, ValueError):
        remove_display_files(int(display_file.read_text().strip()))
    shutil.rmtree(state_dir, ignore_errors=True)


def reap_stale(root: Path) -> list[str]:
    """Remove every desktop under ``root`` whose owner process is gone; their names."""
    reaped = []
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(root.iterdir()):
            if entry.is_dir() and not owner_alive(entry.name):
                log.info("reaping desktop %s left by a dead owner", entry.name)
                remove_desktop(entry)
                reaped.append(entry.name)
    return reaped
