"""``python -m cua_native.monitor drain RUN_DIR``: deliver what runs left in the spill.

Every ``monitor_spill`` directory under ``RUN_DIR`` (the trainer's and its workers') names its
destinations in ``<dest>.meta.json``; each is delivered with the same channel the recorder
uses (same order, same id maps, same acknowledgement ledger), so a drain never sends an
acknowledged row twice.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from cua_native.monitor.client.recorder import SPILL_DIR
from cua_native.monitor.client.sinks import HttpSink, Sink, SqlSink
from cua_native.monitor.client.spill import SinkChannel


def spill_dirs(run_dir: Path) -> list[Path]:
    return sorted({p.parent for p in run_dir.glob(f"**/{SPILL_DIR}/*.meta.json")})


def _sink(meta: dict[str, str], token: str | None, db_url: str | None) -> Sink:
    address = meta["address"]
    if meta["kind"] == "http":
        return HttpSink(address, token)
    from cua_native.monitor.db.store import MonitorStore, make_engine

    url = db_url if db_url and "***" in address else address
    if "***" in url:
        raise ValueError(f"{address}: give the database URL with its password (--db)")
    if make_engine(url).url.render_as_string(hide_password=True) != address:
        raise ValueError(f"--db {db_url!r} is not the spill's database {address}")
    return SqlSink(MonitorStore.open(url, run_dir=Path.cwd()))


async def drain(run_dir: Path, token: str | None, db_url: str | None) -> list[str]:
    """Deliver every spill under ``run_dir``; one line per destination (what happened)."""
    lines: list[str] = []
    for directory in spill_dirs(run_dir):
        for meta_path in sorted(directory.glob("*.meta.json")):
            meta = json.loads(meta_path.read_text())
            try:
                sink = await asyncio.to_thread(_sink, meta, token, db_url)
            except (ValueError, OSError) as exc:
                lines.append(f"{meta.get('address')}: not drained: {exc}")
                continue
            channel = SinkChannel(sink, directory)
            before = channel.spill.pending_rows
            await asyncio.to_thread(channel._prepare)
            done = await channel.drain()
            await channel.aclose()
            left = channel.spill.pending_rows
            state = "all delivered" if done and not left else f"{left} still undelivered"
            why = f" ({channel.halted})" if channel.halted else ""
            lines.append(f"{sink.address}: {before - left} of {before} records sent, {state}{why}")
    return lines


def run(run_dir: str, token: str | None, db_url: str | None) -> int:
    path = Path(run_dir)
    if not path.is_dir():
        print(f"drain: no such run directory {run_dir!r}")
        return 2
    lines = asyncio.run(drain(path, token or os.environ.get("CUA_MONITOR_TOKEN"), db_url))
    for line in lines or [f"drain: nothing spilled under {run_dir}"]:
        print(line)
    return 0 if all("all delivered" in line for line in lines) else 1
