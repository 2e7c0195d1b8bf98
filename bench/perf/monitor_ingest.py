"""Ingest figures of the monitor store (SQLite, or PostgreSQL with --db), side by side in one run:

- episodes/s with one episode per batch and with recorder-sized batches (``--per-batch``
  episodes, what ``SinkChannel`` sends: up to 500 rows);
- per-batch cost while one step fills (after a few warm-up batches into another step): the
  first tenth of the batches against the last tenth (flat means a ratio near 1), in wall time
  (medians, lower quartiles, and the ends of a Theil-Sen line through all batches), in CPU
  time (this process's and the PostgreSQL backend's together, mean), and on PostgreSQL ≥ 15 in
  rows the server read and buffer accesses (pages hit or read) on the database's tables:
  counts the machine's load does not change;
- this process's CPU per episode (parsing, the store's Python, the driver; the database
  server's own work is not in it): on a loaded machine the wall figures swing with the load,
  this column much less;
- the PostgreSQL backend's CPU per episode (read from ``/proc``: a local server only);
- with ``--statements``: the statements whose time grows most from the first tenth of the
  recorder-sized batches to the last (round trip as the client sees it), to name what grows.

uv run python bench/perf/monitor_ingest.py [--db URL] [--episodes 1200] [--turns 10] [--per-batch 20]
    [--statements]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event

from cua_native.monitor.db.store import MonitorStore


def episode_records(tag: str, index: int, turns: int, step: str) -> dict[str, list[Any]]:
    rollout = f"{tag}-ro-{index}"
    return {
        "environments": [
            {"client_id": f"{rollout}:env", "env_type": "sim", "status": "terminated"}
        ],
        "rollouts": [
            {
                "client_id": rollout,
                "rollout_id": rollout,
                "step_client_id": step,
                "task_client_id": "task",
                "env_client_id": f"{rollout}:env",
                "model_path": "m",
                "group_num": index // 8,
                "max_turns": turns,
                "status": "completed",
                "reward": float(index % 2),
                "task_success": index % 2 == 1,
            }
        ],
        "turns": [
            {"client_id": f"{rollout}:{t}", "rollout_client_id": rollout, "turn": t}
            for t in range(1, turns + 1)
        ],
        "actions": [
            {
                "client_id": f"{rollout}:{t}:a",
                "turn_client_id": f"{rollout}:{t}",
                "action_type": "click",
                "tool_args": {"type": "click", "x": 0.5, "y": 0.5},
                "tokens": ["tok"] * 64,
                "logprobs": [-0.1] * 64,
            }
            for t in range(1, turns + 1)
        ],
    }


def merged(batches: list[dict[str, list[Any]]]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for batch in batches:
        for kind, records in batch.items():
            out.setdefault(kind, []).extend(records)
    return out


class ServerCpu:
    """CPU seconds of the PostgreSQL backend serving the store's connection, read from
    ``/proc`` (a local server only; ``None`` otherwise). The store's pool hands its one
    connection to every batch of this single-threaded bench; a changed backend pid voids it."""

    def __init__(self, store: MonitorStore) -> None:
        self.pid: int | None = None
        if store.engine.dialect.name == "postgresql":
            with store.engine.connect() as connection:
                self.pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        self.tick = os.sysconf("SC_CLK_TCK")
        self.valid = self.pid is not None and self.seconds() is not None

    def seconds(self) -> float | None:
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime + stime

    def check(self, store: MonitorStore) -> None:
        with store.engine.connect() as connection:
            pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        self.valid = self.valid and pid == self.pid


SERVER_READS = """
SELECT
    (SELECT COALESCE(SUM(COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0)), 0)
     FROM pg_stat_user_tables),
    (SELECT COALESCE(SUM(COALESCE(heap_blks_hit, 0) + COALESCE(heap_blks_read, 0)
        + COALESCE(idx_blks_hit, 0) + COALESCE(idx_blks_read, 0)
        + COALESCE(toast_blks_hit, 0) + COALESCE(toast_blks_read, 0)
        + COALESCE(tidx_blks_hit, 0) + COALESCE(tidx_blks_read, 0)), 0)
     FROM pg_statio_user_tables)
"""


class ServerReads:
    """Rows read (by scans and index fetches) and buffer accesses on the database's own tables
    (``pg_stat_user_tables``/``pg_statio_user_tables``, all backends: this bench is the
    database's only user) at chosen batches. The store's backend is made to flush its
    statistics first (``pg_stat_force_next_flush``, PostgreSQL 15+; otherwise it flushes at
    most once a second)."""

    def __init__(self, store: MonitorStore) -> None:
        self.store = store
        self.marks: dict[int, tuple[int, int]] = {}
        self.valid = store.engine.dialect.name == "postgresql" and (
            store.engine.dialect.server_version_info or (0,)
        ) >= (15,)

    def mark(self, batch: int) -> None:
        with self.store.engine.connect() as connection:
            connection.exec_driver_sql("SELECT pg_stat_force_next_flush()")
        with self.store.engine.connect() as connection:
            rows, buffers = connection.exec_driver_sql(SERVER_READS).one()
        self.marks[batch] = (int(rows), int(buffers))

    def per_batch(self, start: int, end: int) -> tuple[float, float]:
        """(rows read, buffer accesses) per batch from batch ``start`` to ``end``."""
        (rows0, buffers0), (rows1, buffers1) = self.marks[start], self.marks[end]
        return (rows1 - rows0) / (end - start), (buffers1 - buffers0) / (end - start)


class StatementClock:
    """Seconds per statement (its first words) of the batch being ingested, from SQLAlchemy's
    cursor events on the store's engine; ``batches`` holds one dict per finished batch."""

    def __init__(self, store: MonitorStore) -> None:
        self.current: collections.Counter[str] = collections.Counter()
        self.batches: list[dict[str, float]] = []
        self.began = 0.0
        event.listen(store.engine, "before_cursor_execute", self._before)
        event.listen(store.engine, "after_cursor_execute", self._after)

    def _before(self, *_: Any) -> None:
        self.began = time.perf_counter()

    def _after(self, _connection: Any, _cursor: Any, statement: str, *_: Any) -> None:
        self.current[" ".join(statement.split())[:70]] += time.perf_counter() - self.began

    def end_batch(self) -> None:
        self.batches.append(dict(self.current))
        self.current.clear()

    def growth(self, top: int = 3) -> list[tuple[str, float, float]]:
        """(statement, mean ms in the first tenth, in the last tenth), the largest growth first."""
        tenth = max(1, len(self.batches) // 10)

        def mean(batches: list[dict[str, float]], key: str) -> float:
            return 1000 * sum(b.get(key, 0.0) for b in batches) / len(batches)

        keys = {k for b in self.batches for k in b}
        rows = [(k, mean(self.batches[:tenth], k), mean(self.batches[-tenth:], k)) for k in keys]
        return sorted(rows, key=lambda r: r[1] - r[2])[:top]


def run(
    store: MonitorStore,
    tag: str,
    episodes: int,
    turns: int,
    per_batch: int,
    cpu: list[float],
    server: ServerCpu,
    clock: StatementClock | None = None,
    server_cpu: list[float] | None = None,
    buffers: ServerReads | None = None,
) -> tuple[list[float], float]:
    """Seconds per batch while one step fills with ``episodes`` rollouts (this process's CPU
    seconds per batch are appended to ``cpu``, the server backend's to ``server_cpu``), and the
    server backend's CPU seconds in all. ``buffers`` is marked before the first batch, the first
    after the first tenth, the first of the last tenth, and after the last."""
    step = f"{tag}-step"
    store.ingest(
        {"steps": [{"client_id": step, "training_client_id": "t", "step": hash(tag) % 10**6}]}
    )
    seconds = []
    server_began = server.seconds() if server.valid else None
    starts = range(0, episodes, per_batch)
    tenth = max(1, len(starts) // 10)
    marks = {0, tenth, len(starts) - tenth}
    for index, start in enumerate(starts):
        if buffers is not None and index in marks:
            buffers.mark(index)
        batch = merged(
            [
                episode_records(tag, i, turns, step)
                for i in range(start, min(episodes, start + per_batch))
            ]
        )
        server_batch = server.seconds() if server.valid and server_cpu is not None else None
        began, cpu_began = time.perf_counter(), time.process_time()
        store.ingest(batch)
        seconds.append(time.perf_counter() - began)
        cpu.append(time.process_time() - cpu_began)
        if server_batch is not None and server_cpu is not None:
            server_cpu.append((server.seconds() or server_batch) - server_batch)
        if clock is not None:
            clock.end_batch()
    if buffers is not None:
        buffers.mark(len(starts))
    server_end = server.seconds() if server.valid else None
    used = server_end - server_began if server_end is not None and server_began is not None else 0
    return seconds, used


def lower_quartile(values: list[float]) -> float:
    """The 25th percentile: the load only ever adds time, so the faster batches show the cost."""
    return statistics.quantiles(values, n=4)[0] if len(values) > 1 else values[0]


def theil_sen(values: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the median-of-pairwise-slopes line through ``values`` against
    their index: all batches count, a few slowed by the machine's load do not move it."""
    n = len(values)
    slopes = [(values[j] - values[i]) / (j - i) for i in range(n) for j in range(i + 1, n)]
    slope = statistics.median(slopes) if slopes else 0.0
    return statistics.median(v - slope * i for i, v in enumerate(values)), slope


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db")
    parser.add_argument("--episodes", type=int, default=1200)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--per-batch", type=int, default=20)
    parser.add_argument("--statements", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as run_dir:
        store = MonitorStore.open(args.db, run_dir=run_dir)
        try:
            store.ingest(
                {
                    "training": {"client_id": "t", "run_name": f"bench-{time.time_ns()}"},
                    "tasks": [
                        {"client_id": "task", "task_id": "task", "name": "t", "description": "d"}
                    ],
                }
            )
            single_n = max(20, args.episodes // 20)
            single_cpu: list[float] = []
            batched_cpu: list[float] = []
            server = ServerCpu(store)
            single, single_server = run(
                store, f"one-{time.time_ns()}", single_n, args.turns, 1, single_cpu, server
            )
            # warm-up: the batched statements' shapes compiled and cached (SQLAlchemy, the
            # driver) in a step of their own, so the first tenth below does not pay for it
            run(
                store,
                f"warm-{time.time_ns()}",
                3 * args.per_batch,
                args.turns,
                args.per_batch,
                [],
                server,
            )
            clock = StatementClock(store) if args.statements else None
            batched_server_cpu: list[float] = []
            buffers = ServerReads(store)
            batched, batched_server = run(
                store,
                f"many-{time.time_ns()}",
                args.episodes,
                args.turns,
                args.per_batch,
                batched_cpu,
                server,
                clock,
                batched_server_cpu,
                buffers if buffers.valid else None,
            )
            if server.valid:
                server.check(store)
        finally:
            store.close()
    tenth = max(1, len(batched) // 10)
    first, last = statistics.median(batched[:tenth]), statistics.median(batched[-tenth:])
    print(f"backend: {args.db.split('@')[-1] if args.db else 'sqlite (run dir)'}")
    print(f"episodes of {args.turns} turns (rollout, environment, turns, actions with 64 tokens)")
    print(
        f"{'batches':<20}{'episodes/s':>12}{'ms/batch (median)':>20}{'client CPU ms/ep':>18}"
        f"{'server CPU ms/ep':>18}"
    )
    for label, n, seconds, cpu, server_cpu in (
        ("1 episode", single_n, single, single_cpu, single_server),
        (f"{args.per_batch} episodes", args.episodes, batched, batched_cpu, batched_server),
    ):
        server_text = f"{1000 * server_cpu / n:.2f}" if server.valid else "n/a"
        print(
            f"{label:<20}{n / sum(seconds):>12.1f}{1000 * statistics.median(seconds):>20.1f}"
            f"{1000 * sum(cpu) / n:>18.2f}{server_text:>18}"
        )
    print(
        f"per-batch cost as one step fills to {args.episodes} rollouts: first tenth "
        f"{1000 * first:.1f} ms, last tenth {1000 * last:.1f} ms, ratio {last / first:.2f}"
    )
    low_first, low_last = lower_quartile(batched[:tenth]), lower_quartile(batched[-tenth:])
    print(
        f"  fastest quarter of each tenth (lower quartile): {1000 * low_first:.1f} -> "
        f"{1000 * low_last:.1f} ms, ratio {low_last / low_first:.2f}"
    )
    start, slope = theil_sen(batched)
    end = start + slope * (len(batched) - 1)
    print(
        f"  fitted line (Theil-Sen, all batches): {1000 * start:.1f} -> {1000 * end:.1f} ms, "
        f"ratio {end / start:.2f}"
    )
    both = [
        c + s
        for c, s in zip(
            batched_cpu,
            batched_server_cpu if server.valid else [0.0] * len(batched_cpu),
            strict=True,
        )
    ]
    cpu_first, cpu_last = statistics.mean(both[:tenth]), statistics.mean(both[-tenth:])
    print(
        f"  CPU per batch ({'client + server' if server.valid else 'client'}, mean): first tenth "
        f"{1000 * cpu_first:.1f} ms, last tenth {1000 * cpu_last:.1f} ms, "
        f"ratio {cpu_last / cpu_first:.2f}"
    )
    if buffers.valid:
        n = len(batched)
        first_reads, last_reads = buffers.per_batch(0, tenth), buffers.per_batch(n - tenth, n)
        for label, before, after in zip(
            ("rows read", "buffer accesses"), first_reads, last_reads, strict=True
        ):
            print(
                f"  {label} per batch: first tenth {before:.0f}, last tenth {after:.0f}, "
                f"ratio {after / before:.2f}"
            )

    for statement, first_ms, last_ms in clock.growth() if clock is not None else ():
        print(f"  {first_ms:6.2f} -> {last_ms:6.2f} ms/batch  {statement}")


if __name__ == "__main__":
    main()
