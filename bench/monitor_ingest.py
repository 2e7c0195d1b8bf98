"""Ingest throughput of the monitor store: episodes/s and per-batch latency (SQLite, or --db URL).

uv run python bench/monitor_ingest.py [--db URL] [--episodes 200] [--turns 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from cua_native.monitor.service.store import MonitorStore


def episode_batch(index: int, turns: int) -> dict[str, Any]:
    rollout = f"ro-{index}"
    return {
        "rollouts": [
            {
                "client_id": rollout,
                "rollout_id": rollout,
                "step_client_id": "step-0",
                "task_client_id": "task",
                "model_path": "m",
                "group": index // 8,
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--turns", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as run_dir:
        store = MonitorStore.open(args.db, run_dir=run_dir)
        try:
            training_id = store.ingest(
                {
                    "training": {
                        "client_id": "t",
                        "run_name": f"bench-{time.time_ns()}",
                        "log_path": run_dir,
                        "model_name": "m",
                    },
                    "tasks": [
                        {"client_id": "task", "task_id": "task", "name": "t", "description": "d"}
                    ],
                    "steps": [{"client_id": "step-0", "training_client_id": "t", "step": 0}],
                }
            )["training_id"]
            print(f"training id: {training_id}")
            latencies = []
            start = time.perf_counter()
            for index in range(args.episodes):
                began = time.perf_counter()
                store.ingest(episode_batch(index, args.turns))
                latencies.append(time.perf_counter() - began)
            elapsed = time.perf_counter() - start
        finally:
            store.close()
    print(f"backend: {args.db or 'sqlite (run dir)'}")
    print(f"episodes: {args.episodes} x {args.turns} turns, {elapsed:.2f} s total")
    print(f"episodes/s: {args.episodes / elapsed:.1f}")
    print(
        f"batch latency ms: median {1000 * statistics.median(latencies):.1f}, "
        f"p95 {1000 * statistics.quantiles(latencies, n=20)[-1]:.1f}"
    )


if __name__ == "__main__":
    main()
