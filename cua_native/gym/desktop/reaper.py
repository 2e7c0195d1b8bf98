"""What a local desktop leaves on the machine, and how to remove it on every path.

A desktop lives in a state directory ``<root>/<owner pid>-<owner start time>-<id>``; every
process started for it (Xvfb, window manager, server, and every app those start) carries
``CUA_DESKTOP_ID=<directory name>`` in its environment, so processes that double-fork or start
their own session are found too. Each desktop also has a manifest (``desktop.json`` in its
directory: owner pid and start time, Xvfb's pid and display) and an entry in the machine's
registry (``registry_dir()``, one per user: a symlink named by the desktop to its directory),
so a desktop is found from any state root. ``remove_desktop`` kills its processes, removes the X
display's lock and socket if the killed Xvfb left them (the display from the manifest, or from
the socket its Xvfb listens on), deletes the directory and the registry entry. ``reap_stale``
does that for every desktop whose owner process is gone (a trainer killed with ``kill -9``):
those under the state root, those in the registry (under any root), and marked processes whose
directory is gone too (their marker names the owner), so the next start cleans what an earlier
one left. Blocking (``/proc`` scans, signals, rmtree): call it in a worker thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MARKER = "CUA_DESKTOP_ID"
X_LOCK = "/tmp/.X{n}-lock"
X_SOCKET = "/tmp/.X11-unix/X{n}"
MANIFEST = "desktop.json"
REGISTRY_ENV = "CUA_DESKTOP_REGISTRY"


def registry_dir() -> Path:
    """``$CUA_DESKTOP_REGISTRY``, else ``/tmp/cua_native_desktops-<uid>``: every desktop of
    this user, whatever its state root."""
    return Path(os.environ.get(REGISTRY_ENV) or f"/tmp/cua_native_desktops-{os.getuid()}")


def write_manifest(state_dir: Path, **fields: Any) -> None:
    """Merge ``fields`` into the desktop's manifest (atomically) and register the desktop."""
    path = state_dir / MANIFEST
    manifest = read_manifest(state_dir)
    manifest.update(fields)
    scratch = path.with_suffix(".part")
    scratch.write_text(json.dumps(manifest))
    scratch.rename(path)
    registry = registry_dir()
    registry.mkdir(mode=0o700, parents=True, exist_ok=True)
    link = registry / state_dir.name
    if not link.is_symlink():
        with contextlib.suppress(FileExistsError):
            link.symlink_to(state_dir.resolve())


def read_manifest(state_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((state_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


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


def marked_processes() -> dict[int, str]:
    """Every process carrying a desktop marker, with its desktop (zombies have none)."""
    prefix = f"{MARKER}=".encode()
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        for variable in environ.split(b"\0"):
            if variable.startswith(prefix):
                found[int(entry.name)] = variable[len(prefix) :].decode(errors="replace")
                break
    return found


def marked_pids(desktop_id: str) -> list[int]:
    """Processes whose environment carries this desktop's marker (zombies have none)."""
    return [pid for pid, marked in marked_processes().items() if marked == desktop_id]


def displays_served_by(pids: list[int]) -> list[int]:
    """The X displays whose socket (``/tmp/.X11-unix/X<n>``) one of ``pids`` listens on: the
    desktop's Xvfb (read from ``/proc``: its socket inodes against ``/proc/net/unix``)."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd.path)
                    if target.startswith("socket:["):
                        inodes.add(target[len("socket:[") : -1])
    displays = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[6] in inodes:
                match = re.fullmatch(r"@?/tmp/\.X11-unix/X(\d+)", fields[7])
                if match:
                    displays.add(int(match.group(1)))
    return sorted(displays)


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
    """Kill every process of the desktop in ``state_dir``, its display files, the directory and
    its registry entry."""
    _remove(state_dir.name, state_dir, xvfb_pid)


def _remove(desktop_id: str, state_dir: Path | None, xvfb_pid: int | None = None) -> None:
    """``remove_desktop``; without ``state_dir`` (gone already) its processes and display."""
    displays = set(displays_served_by(marked_pids(desktop_id)))
    if state_dir is not None:
        with contextlib.suppress(OSError, ValueError):
            displays.add(int((state_dir / "display").read_text().strip()))
        display = read_manifest(state_dir).get("display")
        if isinstance(display, int):
            displays.add(display)
    keep = frozenset() if xvfb_pid is None else frozenset({xvfb_pid})
    kill_marked(desktop_id, keep=keep)
    if xvfb_pid is not None:
        stop_xvfb(xvfb_pid)
        kill_marked(desktop_id)
    for display in sorted(displays):
        remove_display_files(display)
    if state_dir is not None:
        shutil.rmtree(state_dir, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        (registry_dir() / desktop_id).unlink()


def reap_stale(root: Path) -> list[str]:
    """Remove every desktop whose owner process is gone: under ``root``, in the registry (any
    root), and marked processes left without either; their names."""
    reaped = []
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(root.iterdir()):
            if entry.is_dir() and not owner_alive(entry.name):
                log.info("reaping desktop %s left by a dead owner", entry.name)
                remove_desktop(entry)
                reaped.append(entry.name)
    with contextlib.suppress(FileNotFoundError):
        for link in sorted(registry_dir().iterdir()):
            if not owner_alive(link.name):
                log.info("reaping registered desktop %s left by a dead owner", link.name)
                target = Path(os.readlink(link)) if link.is_symlink() else None
                # an entry names its desktop's directory: never remove anything else
                _remove(link.name, target if target and target.name == link.name else None)
                with contextlib.suppress(FileNotFoundError):
                    link.unlink()
                reaped.append(link.name)
    orphans = {d for d in marked_processes().values() if not owner_alive(d)}
    for desktop_id in sorted(orphans - set(reaped)):
        log.info("reaping processes of desktop %s (its directory is gone)", desktop_id)
        _remove(desktop_id, None)
        reaped.append(desktop_id)
    return reaped
