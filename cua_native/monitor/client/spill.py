"""Per-sink delivery: resolve parents, send in batches, spill to disk when the sink is down.

Each sink gets one ``SinkChannel`` with one task. Rows are delivered in the order they were
recorded: while anything is spilled, newer rows are appended behind it and the spill is drained
first; rows carry a sequence number, so merged upserts of one record always let the later win.
A row whose parent has no id yet for this sink waits in memory (``waiting``).

Files under ``<run_dir>/monitor_spill/``, named by the sink's destination (``destination_id``:
one set per monitor URL or database, so two destinations never share ids):
  ``<dest>.jsonl`` + ``<dest>.offset``: rows not yet delivered, and how far delivery got
  (rows read but not acknowledged are never appended again; a torn last line from a crash or a
  full disk is cut off when the log is opened and kept in ``<dest>.torn``);
  ``<dest>.ids.jsonl``: ids the sink answered: parents (so a restart still resolves children)
  and acknowledged one-shot rows (actions, observations, validations: never sent twice, since
  the existing monitor has no ``client_id`` to deduplicate them);
  ``<dest>.rejected.jsonl``: rows the sink refused for good, with its reason;
  ``<dest>.meta.json``: where the destination is (no secrets), for ``drain``.
Re-sending a chunk after a crash between send and offset commit is safe for upserted kinds.
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
from cua_native.monitor.client.sinks import (
    Sink,
    SinkHalted,
    SinkRejected,
    SinkUnavailable,
    id_pairs,
)
from cua_native.monitor.ingest import ARRAY_KINDS

log = logging.getLogger(__name__)

KIND_ORDER: dict[str, int] = {TRAINING: 0} | {kind: i + 1 for i, kind in enumerate(ARRAY_KINDS)}
PARENT_KINDS = frozenset({TRAINING, "tasks", "validators", "baselines", "evals", "steps"})
BULK_KINDS = frozenset({"environments", "rollouts", "turns"})
"""Parents that come in great numbers: only the most recent ids are kept."""
ANONYMOUS_KINDS = frozenset({"actions", "observations", "validations"})
"""Kinds the existing monitor's contract has no ``client_id`` for: sent at most once after an
acknowledgement (their ids are remembered like bulk parents')."""
WIRE_CLIENT_IDS = frozenset({"steps", "evals", "baselines"})
"""Kinds whose contract client id embeds the remote training id (``step-<tid>-<step>-0``)."""


class SpillLog:
    """An append-only JSONL file of rows plus a committed read offset. Blocking: run it in a
    thread."""

    def __init__(self, directory: Path, name: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{name}.jsonl"
        self.offset_path = directory / f"{name}.offset"
        self.torn_path = directory / f"{name}.torn"
        self.offset = self._read_offset()
        self._cut_torn_tail()
        self.pending_rows = self._count_pending()

    def _read_offset(self) -> int:
        try:
            return max(0, int(self.offset_path.read_text().strip() or 0))
        except (OSError, ValueError):
            return 0

    def _cut_torn_tail(self) -> None:
        """A last line without its newline is a write that never finished: keep it aside and
        cut it off, so new rows never get glued to it."""
        if not self.path.exists():
            return
        size = self.path.stat().st_size
        if size == 0:
            return
        with self.path.open("rb+") as handle:
            handle.seek(max(0, size - 1))
            if handle.read(1) == b"\n":
                return
            handle.seek(0)
            data = handle.read()
            keep = data.rfind(b"\n") + 1
            with self.torn_path.open("ab") as torn:
                torn.write(data[keep:] + b"\n")
            handle.truncate(keep)
        self.offset = min(self.offset, keep)

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
        """Append rows (raises ``OSError`` when the disk is full; a partial write is cut off by
        the next open)."""
        if not rows:
            return
        lines = "".join(json.dumps(row.to_json(), separators=(",", ":")) + "\n" for row in rows)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(lines)
            handle.flush()
            os.fsync(handle.fileno())
        self.pending_rows += len(rows)

    def read(self, max_rows: int) -> tuple[list[Row], int, int, list[str]]:
        """Up to ``max_rows`` rows after the committed offset: (rows, offset after them, lines
        consumed, lines that are not rows)."""
        rows: list[Row] = []
        bad: list[str] = []
        end = self.offset
        consumed = 0
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            while len(rows) < max_rows:
                line = handle.readline()
                if not line or not line.endswith(b"\n"):
                    break
                end += len(line)
                if not line.strip():
                    continue
                consumed += 1
                try:
                    rows.append(Row.from_json(json.loads(line)))
                except (ValueError, KeyError, TypeError, IndexError):
                    bad.append(line.decode("utf-8", "replace"))
        return rows, end, consumed, bad

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
    """Remote ids for one destination, persisted so a restarted recorder resolves children of
    parents it delivered before and never re-sends an acknowledged one-shot row. Blocking file
    methods: run them in a thread."""

    def __init__(self, path: Path, *, bulk_cap: int = 200_000) -> None:
        self.path = path
        self.bulk_cap = bulk_cap
        self.ids: dict[str, OrderedDict[str, int]] = {}

    def get(self, kind: str, client_id: str) -> int | None:
        known = self.ids.get(kind)
        return None if known is None else known.get(client_id)

    def put(self, kind: str, client_id: str, remote_id: int) -> bool:
        """Remember an id; returns whether it is worth persisting."""
        known = self.ids.setdefault(kind, OrderedDict())
        if known.get(client_id) == remote_id:
            return False
        known[client_id] = remote_id
        if kind not in PARENT_KINDS and len(known) > self.bulk_cap:
            known.popitem(last=False)
        return True

    def load(self) -> None:
        if not self.path.exists():
            return
        with self.path.open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    kind, client_id, remote_id = json.loads(line)
                    self.put(str(kind), str(client_id), int(remote_id))
                except (ValueError, TypeError):
                    continue  # a torn last line
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
        name = sink.destination
        self.spill = SpillLog(spill_dir, name)
        self.ids = IdMap(spill_dir / f"{name}.ids.jsonl")
        self.rejected_path = spill_dir / f"{name}.rejected.jsonl"
        self.meta_path = spill_dir / f"{name}.meta.json"
        self.inbox: list[Row] = []
        self.waiting: list[Row] = []
        self.unspilled: list[Row] = []
        """Rows that could not be written to the spill (disk full): kept in memory."""
        self.rejected_keys: set[tuple[str, str]] = set()
        self.counts = {"delivered": 0, "delayed": 0, "rejected": 0, "failures": 0}
        self.halted: str | None = None
        """Why the sink refuses us as a whole (401/403), if it does."""
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
            "unspilled": len(self.unspilled),
        }

    def undelivered_line(self, run_dir: Path) -> str | None:
        """What this sink still lacks after ``aclose`` and how to deliver it, or ``None``."""
        kept = self.spill.pending_rows + len(self.waiting) + len(self.inbox)
        lost = len(self.unspilled)
        if not kept and not lost:
            return None
        why = f" ({self.halted})" if self.halted else ""
        line = f"monitor: {kept} records not delivered to {self.sink.address}{why}"
        if kept:
            line += (
                f", kept in {self.spill.path.parent}; deliver them with: "
                f"python -m cua_native.monitor drain {run_dir} (or the next run there)"
            )
        if lost:
            line += f"; {lost} more could not be written to disk and are lost"
        return line

    async def start(self) -> None:
        await asyncio.to_thread(self._prepare)
        self._task = asyncio.create_task(self._run(), name=f"monitor-sink-{self.sink.name}")
        if self.spill.pending:
            self._wake.set()

    def _prepare(self) -> None:
        self.ids.load()
        meta = {"kind": self.sink.name, "address": self.sink.address}
        try:
            self.meta_path.write_text(json.dumps(meta))
        except OSError as exc:
            log.warning("monitor sink %s: %s", self.sink.name, exc)

    def submit(self, rows: list[Row]) -> None:
        self.inbox.extend(rows)
        self._wake.set()

    async def aclose(self) -> None:
        """Stop; try once more to deliver what is left, spill the rest. Never raises.

        The last try is made even while a retry was waiting out its backoff (a slow answer or a
        restart during the run must not keep the run's end from the sink); only a sink that
        refused us as a whole (``halted``) is not tried again."""
        self._stopping = True
        self._wake.set()
        try:
            if self._task is not None:
                await self._task
            if self.halted is None:
                await self._attempt()
            await self._spill_rows(self.waiting + self.inbox)
            self.waiting, self.inbox = [], []
        except Exception:
            log.exception("monitor sink %s: close failed", self.sink.name)
        finally:
            try:
                await self.sink.aclose()
            except Exception:
                log.exception("monitor sink %s: close failed", self.sink.name)

    async def drain(self) -> bool:
        """Deliver the spill once (the ``drain`` command); whether nothing is left."""
        await self._attempt()
        return not self.spill.pending and not self.waiting and self.halted is None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            if self.halted is None:
                await self._attempt()
            if self.halted is not None:  # refused as a whole: keep, never retry in a loop
                await self._spill_inbox()
                continue
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
                cause = exc.__cause__
                if isinstance(cause, SinkHalted):
                    if self.halted is None:
                        log.error(
                            "monitor sink %s refuses us (%s): fix the token, then run drain",
                            self.sink.address,
                            cause,
                        )
                    self.halted = str(cause)
                else:
                    low, high = self.backoff
                    self._delay = min(high, max(low, self._delay * 2))
                held = len(exc.rows) + len(self.inbox)
                await self._spill_rows(exc.rows)
                await self._spill_inbox()
                if self.halted is None:
                    log.warning(
                        "monitor sink %s unavailable (%s); %s, retry in %.1fs",
                        self.sink.name,
                        exc,
                        self._where_kept(held),
                        self._delay,
                    )
            except Exception:  # a bug here must not stop recording for good
                log.exception("monitor sink %s: delivery failed", self.sink.name)
                self._delay = self.backoff[1]

    async def _pump(self) -> None:
        while self.spill.pending:
            rows, end, consumed, bad = await asyncio.to_thread(self.spill.read, self.batch_rows)
            if bad:
                await self._write_rejected(
                    [{"reason": "unreadable spill line", "line": b} for b in bad]
                )
                self.counts["rejected"] += len(bad)
            if not consumed:
                self.spill.pending_rows = 0  # nothing readable is left behind the offset
                break
            try:
                # waiting rows go along: a later update of the same record merges into them
                blocked = await self._deliver(self.waiting + rows)
            except _Undelivered as exc:
                # the spilled rows stay in the log (not committed): never append them again
                raise _Undelivered([], str(exc)) from exc.__cause__
            self.waiting = blocked
            await asyncio.to_thread(self.spill.commit, end, consumed)
        if self.unspilled:  # rows the disk refused: older than the inbox
            self.inbox = self.unspilled + self.inbox
            self.unspilled = []
        while self.inbox or self.waiting:
            rows = self.waiting + self.inbox
            self.waiting, self.inbox = [], []
            self.waiting = await self._deliver(rows)
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
        """Append rows to the spill; when the disk refuses, keep them in memory instead (they
        are retried with the next attempt and counted as lost if the run ends first)."""
        rows = self.unspilled + rows
        self.unspilled = []
        if not rows:
            return
        try:
            await asyncio.to_thread(self.spill.append, rows)
        except OSError as exc:
            log.error("monitor sink %s: cannot spill %d rows: %s", self.sink.name, len(rows), exc)
            self.unspilled = rows
            await asyncio.to_thread(self._reopen_spill)
            return
        self.counts["delayed"] += len(rows)

    def _where_kept(self, rows: int) -> str:
        """Where ``rows`` undelivered rows went, as the spill's last write left them."""
        if not self.unspilled:
            return f"{rows} rows spilled to disk"
        return (
            f"{len(self.unspilled)} rows kept in memory: the spill could not be written "
            "(lost if the run ends before the sink or the disk comes back)"
        )

    def _reopen_spill(self) -> None:
        try:
            self.spill = SpillLog(self.spill.path.parent, self.sink.destination)
        except OSError:
            pass

    def _ready(self, rows: list[Row]) -> tuple[list[Row], list[Row], list[Row]]:
        """Split rows into (sendable now, waiting for a parent id, refused with a parent).

        A row waits while its parent is among the rows still to send: the parent's answer may
        change the id (a destination whose database was reset answers new ids)."""
        ready: list[Row] = []
        blocked: list[Row] = []
        orphans: list[Row] = []
        pending_keys = {row.key for row in rows}
        ready_keys: set[tuple[str, str]] = set()
        for row in sorted(rows, key=lambda r: KIND_ORDER.get(r.kind, 99)):
            refs = row.parents.values()
            if any(ref in self.rejected_keys for ref in refs):
                orphans.append(row)
            elif all(
                (self.sink.accepts_client_refs and ref in ready_keys)
                or (ref not in pending_keys and self.ids.get(*ref) is not None)
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
        pending = [
            row
            for row in coalesce(rows)
            if not (row.kind in ANONYMOUS_KINDS and self.ids.get(*row.key) is not None)
        ]
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
            await self._send_group(group)

    async def _send_group(self, group: list[Row]) -> None:
        """Send; on a refusal split in halves until the refused rows are found alone (a poison
        row costs log2(batch) extra requests and blocks nothing else)."""
        try:
            await self._send(group)
        except SinkRejected as exc:
            if len(group) == 1:
                await self._reject(group, str(exc))
                return
            middle = len(group) // 2
            await self._send_group(group[:middle])
            await self._send_group(group[middle:])

    async def _send(self, rows: list[Row]) -> None:
        batch, wire = self._batch(rows)
        try:
            answer = await asyncio.wait_for(self.sink.send(batch), self.send_timeout)
        except TimeoutError as exc:
            raise SinkUnavailable(f"no answer in {self.send_timeout}s") from exc
        self.counts["delivered"] += len(rows)
        for row in rows:
            self.rejected_keys.discard(row.key)
        learned = self._learn_ids(rows, wire, answer)
        if learned:
            await asyncio.to_thread(self.ids.append, learned)

    def _wire_client_id(self, row: Row) -> str | None:
        """The ``client_id`` on the wire: ours, none (contract kinds without one), or the
        contract's form built on the remote training id (``step-<tid>-<step>-0``)."""
        if not self.sink.contract_only:
            return row.client_id
        if row.kind == TRAINING or row.kind in ANONYMOUS_KINDS:
            return None
        if row.kind in WIRE_CLIENT_IDS and "training" in row.parents:
            run_name = row.parents["training"][1]
            remote = self.ids.get(TRAINING, run_name)
            if remote is not None:
                return row.client_id.replace(f"-{run_name}-", f"-{remote}-", 1)
        return row.client_id

    def _batch(self, rows: list[Row]) -> tuple[dict[str, Any], list[str | None]]:
        batch: dict[str, Any] = {}
        wire: list[str | None] = []
        for row in rows:
            fields = dict(row.fields)
            client_id = self._wire_client_id(row)
            wire.append(client_id)
            if client_id is not None and row.kind != TRAINING:
                fields["client_id"] = client_id
            for ref, parent in row.parents.items():
                remote = self.ids.get(*parent)
                if remote is not None:
                    fields[f"{ref}_id"] = remote
                else:
                    fields[f"{ref}_client_id"] = parent[1]
            if row.kind == TRAINING:
                if not self.sink.contract_only:
                    fields["client_id"] = row.client_id
                remote = self.ids.get(TRAINING, row.client_id)
                if remote is not None:
                    fields["training_id"] = remote
                batch[TRAINING] = fields
            else:
                batch.setdefault(row.kind, []).append(fields)
        return batch, wire

    def _learn_ids(
        self, rows: list[Row], wire: list[str | None], answer: dict[str, Any]
    ) -> list[tuple[str, str, int]]:
        learned: list[tuple[str, str, int]] = []

        def remember(kind: str, client_id: str, remote_id: int) -> None:
            if self.ids.put(kind, client_id, remote_id):
                learned.append((kind, client_id, remote_id))

        training = next((row for row in rows if row.kind == TRAINING), None)
        if training is not None and isinstance(answer.get("training_id"), int):
            known = self.ids.get(TRAINING, training.client_id)
            if known is not None and known != answer["training_id"]:
                # the destination forgot us (database reset or another monitor): ids are stale
                log.warning("monitor sink %s: training id changed; ids reset", self.sink.name)
                self.ids.ids.clear()
            remember(TRAINING, training.client_id, answer["training_id"])
        sent: dict[str, tuple[list[str], list[str | None]]] = {}
        for row, wire_id in zip(rows, wire, strict=True):
            if row.kind != TRAINING:
                own, wires = sent.setdefault(row.kind, ([], []))
                own.append(row.client_id)
                wires.append(wire_id)
        for kind, (client_ids, wire_ids) in sent.items():
            for client_id, remote_id in id_pairs(kind, client_ids, answer, wire_ids):
                remember(kind, client_id, remote_id)
        return learned

    async def _reject(self, rows: list[Row], reason: str) -> None:
        if not rows:
            return
        self.counts["rejected"] += len(rows)
        self.rejected_keys.update(row.key for row in rows)
        log.error("monitor sink %s rejected %d rows: %s", self.sink.name, len(rows), reason[:500])
        await self._write_rejected([{"reason": reason, "row": row.to_json()} for row in rows])

    async def _write_rejected(self, entries: list[dict[str, Any]]) -> None:
        lines = [json.dumps(entry) + "\n" for entry in entries]
        try:
            await asyncio.to_thread(_append_lines, self.rejected_path, lines)
        except OSError as exc:
            log.error(
                "monitor sink %s: cannot write %s: %s", self.sink.name, self.rejected_path, exc
            )


def _append_lines(path: Path, lines: list[str]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.writelines(lines)
