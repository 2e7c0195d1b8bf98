"""The monitor's SQL store: applies ingest batches (``ingest.py``) to SQLite or PostgreSQL.

One writer: ``ingest`` holds a lock and applies a whole batch in one transaction (all or nothing).
``aingest`` runs it on the store's own single worker thread, so the event loop never blocks.
The batch is written set-based (``writer.py``: a few statements per kind, not per record);
status changes write ``status_history`` rows; progress fields are brought up to date after each
batch (``progress.py``; a step's from running tallies, ``tally.py``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from cua_native.monitor.db.migrations.runner import upgrade_to_head
from cua_native.monitor.db.progress import TERMINAL_ROLLOUT
from cua_native.monitor.db.writer import BatchWriter
from cua_native.monitor.ingest import IngestBatch, IngestError, describe, parse_batch
from cua_native.monitor.screenshots import ScreenshotError, ScreenshotStore

SQLITE_FILE = "monitor.db"
RETRIED_SQLSTATES = frozenset({"40P01", "40001"})
"""PostgreSQL's deadlock_detected and serialization_failure: the server rolled the batch back
and another attempt can succeed (two writers took row locks in opposite orders)."""
INGEST_ATTEMPTS = 4


def default_sqlite_url(run_dir: Path | str) -> str:
    return f"sqlite:///{Path(run_dir).resolve() / SQLITE_FILE}"


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL, foreign keys and a busy timeout on each connection."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 10})


class MonitorStore:
    """The SQL side of the ingest contract plus read access for the dashboard."""

    def __init__(self, engine: Engine, run_dir: Path | str) -> None:
        self.engine = engine
        self.run_dir = Path(run_dir).resolve()
        self.screenshots = ScreenshotStore(self.run_dir)
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._write_lock = threading.Lock()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="monitor-store")

    @classmethod
    def open(cls, url: str | None = None, *, run_dir: Path | str) -> MonitorStore:
        """Open (and migrate to head) the store at ``url``; default: SQLite in ``run_dir``."""
        run_path = Path(run_dir)
        run_path.mkdir(parents=True, exist_ok=True)
        engine = make_engine(url or default_sqlite_url(run_path))
        try:
            upgrade_to_head(engine)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, run_path)

    @classmethod
    async def aopen(cls, url: str | None = None, *, run_dir: Path | str) -> MonitorStore:
        return await asyncio.to_thread(cls.open, url, run_dir=run_dir)

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A read session (the dashboard's queries)."""
        with self._sessions() as session:
            yield session

    def ingest(self, batch: dict[str, Any] | IngestBatch) -> dict[str, Any]:
        """Apply one batch; answer ``{training_id?, kind: [{client_id, id}]}``.

        Raises ``IngestError`` (nothing written) on any invalid record. A batch PostgreSQL
        aborted as a deadlock or serialization failure (two writers locking rows in opposite
        orders) is applied again, up to ``INGEST_ATTEMPTS`` times: every attempt is one
        transaction, so a failed one left nothing behind."""
        try:
            parsed = batch if isinstance(batch, IngestBatch) else parse_batch(batch)
        except ValidationError as exc:
            raise IngestError(f"invalid batch: {describe(exc)}") from exc
        with self._write_lock:
            for attempt in range(1, INGEST_ATTEMPTS + 1):
                try:
                    return self._apply(parsed)
                except IntegrityError as exc:
                    raise IngestError(f"batch violates a database rule: {exc.orig}") from exc
                except ScreenshotError as exc:
                    raise IngestError(str(exc)) from exc
                except DBAPIError as exc:
                    if attempt == INGEST_ATTEMPTS or not _retryable(exc):
                        raise
            raise AssertionError("unreachable")  # the loop returns or raises

    def _apply(self, parsed: IngestBatch) -> dict[str, Any]:
        """One transaction: the whole batch, or nothing (rolled back on any error)."""
        with self.engine.begin() as connection:
            if connection.dialect.name == "sqlite":
                # the write lock first: a batch's reads and writes are one snapshot
                # even when another process writes to the same file (``tally.py``)
                connection.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                # a batch reads and writes only rows it names, by key: never let the
                # planner scan a table for them (it prefers to while tables are small
                # and its statistics young, and the cost then grows with every row)
                connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
            return BatchWriter(connection, self.screenshots).apply(parsed)

    async def aingest(self, batch: dict[str, Any] | IngestBatch) -> dict[str, Any]:
        """``ingest`` on the store's writer thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer, self.ingest, batch)


def _retryable(exc: DBAPIError) -> bool:
    """A deadlock or serialization failure: PostgreSQL aborted the transaction, not the batch's
    fault (``RETRIED_SQLSTATES``)."""
    return getattr(exc.orig, "sqlstate", None) in RETRIED_SQLSTATES


__all__ = [
    "TERMINAL_ROLLOUT",
    "IngestError",
    "MonitorStore",
    "default_sqlite_url",
    "make_engine",
]
