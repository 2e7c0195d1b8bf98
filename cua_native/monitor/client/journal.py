"""A run's journal of the records it opened: what a later start closes when the run was killed.

The recorder writes every row of a record with a lifecycle (``JOURNALED``: the training, its
tasks, steps, evals, baselines, rollouts and environments) to
``<run_dir>/monitor_journal/<run name>.<pid>.jsonl`` and ``fsync``s it before any sink is given
those rows (``OpenJournal.append``, in a worker thread). Whatever any store holds of a run is
therefore in its journal, whichever sink delivered what before the process died. A run that
ends (completed, failed, cancelled: its ends are delivered or spilled) removes its journal
(``OpenJournal.finish``); a ``kill -9`` leaves it.

The next run started in the same run directory (``TrainingMonitor.start``) reads the journals
of runs whose process is gone (``recover``) and sends, to every sink, each of their records'
last journaled state, the open ones closed: rollouts, evals, baselines and environments
``interrupted``, steps ``failed`` (steps have no other end) and the training ``interrupted``,
each with a message saying why. Every store then holds the same true end for each record,
whichever rows reached it before the kill; sending a record's state again is an upsert. A
journal that cannot be written (a full disk) is given up with one warning: the run goes on, and
the ledger's ``failed`` (``RunLedger``) is what the next run records for it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from cua_native.monitor.client.events import TRAINING, Row, coalesce, utc_now

log = logging.getLogger(__name__)

JOURNAL_DIR = "monitor_journal"
JOURNALED = frozenset(
    {TRAINING, "tasks", "steps", "evals", "baselines", "rollouts", "environments"}
)
INTERRUPTED = "interrupted"
INTERRUPTED_MESSAGE = "interrupted: the run's process ended without closing it (killed?)"
ENDED: dict[str, tuple[str, ...]] = {
    TRAINING: ("completed", "failed", "cancelled", INTERRUPTED),
    "steps": ("completed", "failed"),
    "evals": ("completed", "failed", "cancelled", INTERRUPTED),
    "baselines": ("completed", "failed", "cancelled", INTERRUPTED),
    "rollouts": ("completed", "failed", "cancelled", INTERRUPTED),
    "environments": ("terminated", "error", INTERRUPTED),
}
"""Per kind, the statuses that end a record; any other status (or none) is open."""


class OpenJournal:
    """The journal of one recorder (one process of one run). Blocking: call it from a worker
    thread. Never raises."""

    def __init__(self, run_dir: Path | str, run_name: str) -> None:
        self.run_name = run_name
        self.path = Path(run_dir) / JOURNAL_DIR / f"{run_name}.{os.getpid()}.jsonl"
        self._handle: IO[bytes] | None = None
        self.broken = False

    def append(self, rows: Iterable[Row]) -> None:
        """Journal the rows of ``JOURNALED`` kinds, flushed and ``fsync``ed: call it before the
        rows go to any sink."""
        lines = [json.dumps(row.to_json()) + "\n" for row in rows if row.kind in JOURNALED]
        if not lines or self.broken:
            return
        try:
            if self._handle is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._handle = self.path.open("ab")
                header = {"journal": self.run_name, "pid": os.getpid(), "time": utc_now()}
                lines.insert(0, json.dumps(header) + "\n")
            self._handle.write("".join(lines).encode())
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as exc:
            self.broken = True
            log.warning(
                "monitor: the journal %s cannot be written (%s): if this run is killed, the next"
                " run marks it failed but cannot close its open records",
                self.path,
                exc,
            )

    def finish(self) -> None:
        """The run ended and its ends are delivered or spilled: the journal goes."""
        if self._handle is not None:
            with contextlib.suppress(OSError):
                self._handle.close()
            self._handle = None
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)


@dataclass(slots=True)
class Recovered:
    """What ``recover`` found: the rows to send, the runs they close, the journals read (which
    go once the rows are journaled again by the recorder that sends them:
    ``Recorder.adopt``)."""

    rows: list[Row] = field(default_factory=list)
    runs: set[str] = field(default_factory=set)
    journals: list[Path] = field(default_factory=list)


def recover(run_dir: Path | str, own_run: str, alive: Callable[[Any], bool]) -> Recovered:
    """The last journaled state of every record of the runs whose process is gone (``alive``
    of the journal's pid is false), open ones closed (see the module). Blocking: reads files."""
    found = Recovered()
    directory = Path(run_dir) / JOURNAL_DIR
    if not directory.is_dir():
        return found
    now = utc_now()
    for path in sorted(directory.glob("*.jsonl")):
        header, rows = _read(path)
        if header is None or header.get("journal") == own_run or alive(header.get("pid")):
            continue
        found.journals.append(path)
        found.runs.add(str(header["journal"]))
        for row in coalesce(rows):
            row.fields.update(_closing(row, now))
            found.rows.append(row)
    return found


def _read(path: Path) -> tuple[dict[str, Any] | None, list[Row]]:
    """The header and rows of a journal; a torn or unreadable line (the kill) is skipped."""
    header: dict[str, Any] | None = None
    rows: list[Row] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        log.warning("monitor: cannot read the journal %s: %s", path, exc)
        return None, []
    for line in text.splitlines():
        try:
            data = json.loads(line)
            if header is None:
                header = data if isinstance(data, dict) and "journal" in data else None
                if header is None:
                    return None, []
                continue
            rows.append(Row.from_json(data))
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            continue
    return header, rows


def _closing(row: Row, now: str) -> dict[str, Any]:
    """The fields that close ``row``'s record when its journaled state is open (else none)."""
    ended = ENDED.get(row.kind)
    if ended is None or "status" not in row.fields or row.fields["status"] in ended:
        return {}  # a record the run only referred to (no status) is its owner's to close
    if row.kind == "environments":
        return {"status": INTERRUPTED, "status_message": INTERRUPTED_MESSAGE}
    status = "failed" if row.kind == "steps" else INTERRUPTED
    return {"status": status, "error_message": INTERRUPTED_MESSAGE, "end_time": now}
