"""Per-sink delivery: resolve parents, send in batches, spill to disk when the sink is down.

Each sink gets one ``SinkChannel`` with one task. Rows are delivered in the order they were
recorded: while anything is spilled, newer rows are appended behind it and the spill is drained
first, so a later upsert of a record never lands before an earlier one. A row whose parent has no
id yet for this sink waits in memory (``waiting``) and goes with a later batch.

Files under ``<run_dir>/monitor_spill/`` (JSONL, one row a line):
  ``<sink>.jsonl`` + ``<sink>.offset``: rows not yet delivered, and how far delivery got;
  ``<sink>.ids.jsonl``: parent ids the sink answered (so a restart can still resolve children);
  ``<sink>.rejected.jsonl``: rows the sink refused for good, with its reason.
Re-sending a chunk after a crash between send and offset commit is safe: ingest is an upsert by
``client_id``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

from cua_native.monitor.client.events import TRAINING, Row, coalesce
from cua_native.monitor.client.sinks import Sink, SinkRejected, SinkUnavailable, id_pairs
from cua_native.monitor.ingest import ARRAY_KINDS

log = logging.getLogger(__name__)

KIND_ORDER: dict[str, int] = {TRAINING: 0} | {kind: i + 1 for i, kind in enumerate(ARRAY_KINDS)}
PARENT_KINDS = frozenset({TRAINING, "tasks", "validators", "baselines", "evals", "steps"})
BULK_PARENT_KINDS = frozenset({"rollouts", "turns"})
"""Parents that come in great numbers: only the most recent ids are kept."""


class SpillLog:
    """An append-only JSONL file of rows plus a committed read offset. Blocking: run it in a
    thread."""

    def __init__(self, directory: Path, name: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{name}.jsonl"
        self.offset_path = directory / f"{name}.offset"
        self.offset = int(self.offset_path.read_text()) if self.offset_path.exists() else 0
        self.pending_rows = self._count_pending()

    def _count_pending(self) -> int:
        if not self.path.exists():
            return 0
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            return sum(1 for line in handle if line.strip())

    @property
    def pending(self) -> bool:
        return self.pending_rows > 0

    def append(self, rows: list[Row]) -> None:
        if not rows:
            return
        lines = "".join(json.dumps(row.to_json(), separators=(",", ":")) + "\n" for row in rows)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(lines)
            handle.flush()
            os.fsync(handle.fileno())
        self.pending_rows += len(rows)

    def read(self, max_rows: int) -> tuple[list[Row], int]:
        """Up to ``max_rows`` rows after the committed offset, and the offset after them."""
        rows: list[Row] = []
        end = self.offset
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            while len(rows) < max_rows:
                line = handle.readline()
                if not line:
                    break
                if not line.endswith(b"\n"):
                    break  # a torn last line from a crash mid-append: not committed data
                end += len(line)
                if line.strip():
                    rows.append(Row.from_json(json.loads(line)))
        return rows, end

    def commit(self, end: int, rows: int) -> None:
        self.pending_rows = max(0, self.pending_rows - rows)
        if self.pending_rows == 0 and end >= self.path.stat().st_size:
            self.path.unlink(missing_ok=True)
            self.offset_path.unlink(missing_ok=True)
            self.offset = 0
            return
        tmp = self.offset_path.with_suffix(".offset.tmp")
        tmp.write_text(str(end))
        os.replace(tmp, self.offset_path)
        self.offset = end


class IdMap:
    """Remote ids of parents for one sink, persisted so a restarted recorder resolves children of
    parents it delivered before. Blocking file methods: run them in a thread."""

    def __init__(self, path: Path, *, bulk_cap: int = 200_000) -> None:
        self.path = path
        self.bulk_cap = bulk_cap
        self.ids: dict[str, OrderedDict[str, int]] = {}

    def get(self, kind: str, client_id: str) -> int | None:
        return self.ids.get(kind, {}).get(client_id)

    def put(self, kind: str, client_id: str, remote_id: int) -> bool:
        """Remember an id; returns whether it is worth persisting."""
        if kind not in PARENT_KINDS and kind not in BULK_PARENT_KINDS:
            return False
        known = self.ids.setdefault(kind, OrderedDict())
        if known.get(client_id) == remote_id:
            return False
        known[client_id] = remote_id
        if kind in BULK_PARENT_KINDS and len(known) > self.bulk_cap:
            known.popitem(last=False)
        return True

    def load(self) -> None:
        if not self.path.exists():
            return
        with self.path.open(encoding="utf-8") as handle:
            for line in handle:
                try:
                    kind, client_id, remote_id = json.loads(line)
                except ValueError:
                    continue  # a torn last line
                self.put(kind, client_id, int(remote_id))
        self._rewrite()

    def _rewrite(self) -> None:
        """Compact the file to what is kept in memory."""
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as handle:
            for kind, known in self.ids.items():
                for client_id, remote_id in known.items():
                    handle.write(json.dumps([kind, client_id, remote_id]) + "\n")
        os.replace(tmp, self.path)

    def append(self, entries: list[tuple[str, str, int]]) -> None:
        if entries:
            with self.path.open("a", encoding="utf-8") as handle:
                handle.writelines(json.dumps(list(entry)) + "\n" for entry in entries)


class _Undelivered(Exception):
    def __init__(self, rows: list[Row], reason: str) -> None:
        super().__init__(reason)
        self.rows = rows


class SinkChannel:
    """Delivers rows to one sink from its own task; never raises to the recorder."""

    def __init__(
        self,
        sink: Sink,
        spill_dir: Path,
        *,
        batch_rows: int = 500,
        send_timeout: float = 30.0,
        backoff: tuple[float, float] = (0.5, 30.0),
        max_waiting: int = 50_000,
    ) -> None:
        self.sink = sink
        self.batch_rows = batch_rows
        self.send_timeout = send_timeout
        self.backoff = backoff
        self.max_waiting = max_waiting
        self.spill = SpillLog(spill_dir, sink.name)
        self.ids = IdMap(spill_dir / f"{sink.name}.ids.jsonl")
        self.rejected_path = spill_dir / f"{sink.name}.rejected.jsonl"
        self.inbox: list[Row] = []
        self.waiting: list[Row] = []
        self.rejected_keys: set[tuple[str, str]] = set()
        self.counts = {"delivered": 0, "delayed": 0, "rejected": 0, "failures": 0}
        self._delay = 0.0
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def stats(self) -> dict[str, int]:
        return self.counts | {
            "spilled": self.spill.pending_rows,
            "waiting": len(self.waiting),
            "inbox": len(self.inbox),
        }

    def undelivered_line(self, run_dir: Path) -> str | None:
        """What this sink still lacks after ``aclose`` and how to deliver it, or ``None``."""
        left = self.spill.pending_rows + len(self.waiting) + len(self.inbox)
        if not left:
            return None
        return (
            f"monitor: {left} records not delivered to {self.sink.name} (kept in "
            f"{self.spill.path.parent}); deliver them with: python -m cua_native.monitor drain "
            f"{run_dir} (or by the next run in that directory)"
        )

    async def start(self) -> None:
        await asyncio.to_thread(self.ids.load)
        self._task = asyncio.create_task(self._run(), name=f"monitor-sink-{self.sink.name}")
        if self.spill.pending:
            self._wake.set()

    def submit(self, rows: list[Row]) -> None:
        self.inbox.extend(rows)
        self._wake.set()

    async def aclose(self) -> None:
        """Stop; deliver what is left if the sink is up, spill the rest."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
        try:
            if self._delay == 0.0:
                await self._attempt()
            await self._spill_rows(self.waiting + self.inbox)
            self.waiting, self.inbox = [], []
        finally:
            await self.sink.aclose()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            await self._attempt()
            if self._delay > 0:
                deadline = loop.time() + self._delay
                while not self._stopping and (left := deadline - loop.time()) > 0:
                    try:
                        await asyncio.wait_for(self._wake.wait(), left)
                    except TimeoutError:
                        break
                    self._wake.clear()
                    await self._spill_inbox()  # the sink is down: keep memory flat
                self._wake.set()

    async def _attempt(self) -> None:
        async with self._lock:
            try:
                await self._pump()
                self._delay = 0.0
            except _Undelivered as exc:
                self.counts["failures"] += 1
                low, high = self.backoff
                self._delay = min(high, max(low, self._delay * 2))
                log.warning(
                    "monitor sink %s unavailable (%s); %d rows spilled, retry in %.1fs",
                    self.sink.name,
                    exc,
                    len(exc.rows) + len(self.inbox),
                    self._delay,
                )
                await self._spill_rows(exc.rows)
                await self._spill_inbox()
            except Exception:  # a bug here must not stop recording for good
                log.exception("monitor sink %s: delivery failed", self.sink.name)
                self._delay = self.backoff[1]

    async def _pump(self) -> None:
        while self.spill.pending:
            rows, end = await asyncio.to_thread(self.spill.read, self.batch_rows)
            # rows still waiting go first: a later update of the same record merges into them
            self.waiting = await self._deliver(self.waiting + rows)
            await asyncio.to_thread(self.spill.commit, end, len(rows))
            if not rows:
                break
        while self.inbox or self.waiting:
            rows = self.waiting + self.inbox
            self.waiting, self.inbox = [], []
            blocked = await self._deliver(rows)
            self.waiting = blocked
            if not self.inbox:
                break
        if len(self.waiting) > self.max_waiting:
            log.warning(
                "monitor sink %s: %d rows wait for parents", self.sink.name, len(self.waiting)
            )

    async def _spill_inbox(self) -> None:
        rows, self.inbox = self.inbox, []
        await self._spill_rows(rows)

    async def _spill_rows(self, rows: list[Row]) -> None:
        if rows:
            await asyncio.to_thread(self.spill.append, rows)
            self.counts["delayed"] += len(rows)

    def _ready(self, rows: list[Row]) -> tuple[list[Row], list[Row], list[Row]]:
        """Split rows into (sendable now, waiting for a parent id, refused with a parent)."""
        ready: list[Row] = []
        blocked: list[Row] = []
        orphans: list[Row] = []
        ready_keys: set[tuple[str, str]] = set()
        for row in sorted(rows, key=lambda r: KIND_ORDER.get(r.kind, 99)):
            refs = row.parents.values()
            if any(ref in self.rejected_keys for ref in refs):
                orphans.append(row)
            elif all(
                self.ids.get(*ref) is not None
                or (self.sink.accepts_client_refs and ref in ready_keys)
                for ref in refs
            ):
                ready.append(row)
                ready_keys.add(row.key)
            else:
                blocked.append(row)
        return ready, blocked, orphans

    async def _deliver(self, rows: list[Row]) -> list[Row]:
        """Send rows in waves until none is ready; returns the rows still waiting for parents.
        Raises ``_Undelivered`` with every row not yet delivered when the sink is down."""
        pending = coalesce(rows)
        while pending:
            ready, blocked, orphans = self._ready(pending)
            await self._reject(orphans, "its parent was rejected")
            if not ready:
                return blocked
            for start in range(0, len(ready), self.batch_rows):
                chunk = ready[start : start + self.batch_rows]
                try:
                    await self._send_chunk(chunk)
                except SinkUnavailable as exc:
                    raise _Undelivered(ready[start:] + blocked, str(exc)) from exc
            pending = blocked
        return []

    async def _send_chunk(self, chunk: list[Row]) -> None:
        trainings = [row for row in chunk if row.kind == TRAINING]
        # one training object per batch; all of them before the rows that may refer to them
        groups = [[row] for row in trainings[:-1]]
        groups.append(trainings[-1:] + [row for row in chunk if row.kind != TRAINING])
        for group in groups:
            try:
                await self._send(group)
            except SinkRejected as exc:
                if len(group) == 1:
                    await self._reject(group, str(exc))
                    continue
                for row in group:  # find the bad rows; deliver the rest
                    try:
                        await self._send([row])
                    except SinkRejected as single:
                        await self._reject([row], str(single))

    async def _send(self, rows: list[Row]) -> None:
        batch = self._batch(rows)
        try:
            answer = await asyncio.wait_for(self.sink.send(batch), self.send_timeout)
        except TimeoutError as exc:
            raise SinkUnavailable(f"no answer in {self.send_timeout}s") from exc
        self.counts["delivered"] += len(rows)
        for row in rows:
            self.rejected_keys.discard(row.key)
        learned = self._learn_ids(rows, answer)
        if learned:
            await asyncio.to_thread(self.ids.append, learned)

    def _batch(self, rows: list[Row]) -> dict[str, Any]:
        batch: dict[str, Any] = {}
        for row in rows:
            fields = dict(row.fields)
            fields["client_id"] = row.client_id
            for ref, parent in row.parents.items():
                remote = self.ids.get(*parent)
                if remote is not None:
                    fields[f"{ref}_id"] = remote
                else:
                    fields[f"{ref}_client_id"] = parent[1]
            if row.kind == TRAINING:
                remote = self.ids.get(TRAINING, row.client_id)
                if remote is not None:
                    fields["training_id"] = remote
                batch[TRAINING] = fields
            else:
                batch.setdefault(row.kind, []).append(fields)
        return batch

    def _learn_ids(self, rows: list[Row], answer: dict[str, Any]) -> list[tuple[str, str, int]]:
        learned: list[tuple[str, str, int]] = []

        def remember(kind: str, client_id: str, remote_id: int) -> None:
            if self.ids.put(kind, client_id, remote_id):
                learned.append((kind, client_id, remote_id))

        training = next((row for row in rows if row.kind == TRAINING), None)
        if training is not None and isinstance(answer.get("training_id"), int):
            remember(TRAINING, training.client_id, answer["training_id"])
        sent: dict[str, list[str]] = {}
        for row in rows:
            if row.kind != TRAINING:
                sent.setdefault(row.kind, []).append(row.client_id)
        for kind, client_ids in sent.items():
            for client_id, remote_id in id_pairs(kind, client_ids, answer):
                remember(kind, client_id, remote_id)
        return learned

    async def _reject(self, rows: list[Row], reason: str) -> None:
        if not rows:
            return
        self.counts["rejected"] += len(rows)
        self.rejected_keys.update(row.key for row in rows)
        log.error("monitor sink %s rejected %d rows: %s", self.sink.name, len(rows), reason[:500])
        lines = [json.dumps({"reason": reason, "row": row.to_json()}) + "\n" for row in rows]
        await asyncio.to_thread(_append_lines, self.rejected_path, lines)


def _append_lines(path: Path, lines: list[str]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.writelines(lines)
