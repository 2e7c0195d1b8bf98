"""Parse throughput of the dialects on the fixture corpus (single process).

Run: ``uv run python bench/perf/parse.py [--seconds 1.0]``. A line is "well-formed" when it parses
with no error and no repair warning, "malformed" otherwise (``tests/fixtures/malformed.jsonl``,
the truncated/leaky real outputs). Target: >= 20,000 well-formed outputs/s per core.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

from cua_native.actions.dialects import Dialect, get_dialect

FIXTURES = Path(__file__).parents[2] / "tests" / "fixtures"
Item = tuple[Dialect, str, tuple[int, int] | None]


def load_corpus() -> dict[tuple[str, str], list[Item]]:
    """(dialect family, "well-formed" | "malformed") → items."""
    groups: dict[tuple[str, str], list[Item]] = defaultdict(list)
    dialects: dict[str, Dialect] = {}
    for path in sorted(FIXTURES.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            options = row.get("options") or {}
            key = json.dumps([row["dialect"], options], sort_keys=True)
            if key not in dialects:
                dialects[key] = get_dialect(row["dialect"], **options)
            dialect = dialects[key]
            size = tuple(row["image_size"]) if "image_size" in row else None
            parsed = dialect.parse(row["text"], image_size=size)  # type: ignore[arg-type]
            kind = "well-formed" if parsed.ok and not parsed.warnings else "malformed"
            family = "mai_ui" if row["dialect"].startswith("mai_ui") else "qwen"
            groups[(family, kind)].append((dialect, row["text"], size))  # type: ignore[arg-type]
    return groups


def throughput(items: list[Item], seconds: float) -> tuple[float, int]:
    done, start = 0, time.perf_counter()
    while True:
        for dialect, text, size in items:
            dialect.parse(text, image_size=size)
        done += len(items)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return done / elapsed, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=1.0, help="time per row")
    args = parser.parse_args()
    corpus = load_corpus()
    print(
        f"{'dialect':<8} {'outputs':<12} {'distinct':>8} {'parsed':>9} {'outputs/s':>11} {'us/output':>10}"
    )
    for (family, kind), items in sorted(corpus.items()):
        rate, done = throughput(items, args.seconds)
        print(
            f"{family:<8} {kind:<12} {len(items):>8} {done:>9} {rate:>11,.0f} {1e6 / rate:>10.1f}"
        )


if __name__ == "__main__":
    main()
