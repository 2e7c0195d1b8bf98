"""Which tasks does a run learn, lose or never solve? One row per task from its monitor database.

Reads a run's SQLite monitor database (read-only) and prints, per task, the success rate of
the baseline evaluation (``base``), of the training batches by block of ``--block`` steps
(``t00``, ``t10``, ...) and of each evaluation (``e9`` = after step 9); ``-`` where the task
was not played (unseen tasks in training). With ``--show TASK,...`` it then prints the actions
of every baseline and last-evaluation episode of those tasks, one line each: how it ended,
its actions in order, and the first thought.

    uv run python bench/task_table.py runs/default/monitor.db --show sim-009,sim-010

``bench/group_signal.py`` answers the other question about the same database: how much
signal the training groups carry.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from collections import defaultdict
from pathlib import Path

_ROLLOUTS = """
select r.id, t.task_id, r.source_type, s.step, e.step, r.task_success
from rollout r
join task t on t.id = r.task_id
left join step s on s.id = r.step_id
left join eval e on e.id = r.eval_id
"""


def column_of(source: str, train_step: int | None, eval_step: int | None, block: int) -> str:
    """The table column a rollout counts in: baseline, a training block, or an evaluation."""
    if source == "baseline":
        return "base"
    if eval_step is not None:
        return f"e{eval_step}"
    if train_step is not None:
        return f"t{train_step // block * block:02d}"
    return source


def _column_order(column: str) -> tuple[int, int, str]:
    rank = {"b": 0, "t": 1, "e": 2}.get(column[0], 3)
    digits = "".join(ch for ch in column if ch.isdigit())
    return rank, int(digits) if digits else -1, column


def action_label(action_json: str | None, parse_error: str | None) -> str:
    """A short label of one turn's action: ``click:0.50,0.14``, ``open_app:Notes``, ``ERR``."""
    if parse_error:
        return "ERR"
    action = json.loads(action_json) if action_json else {}
    kind = str(action.get("type", "?"))
    for key in ("name", "text", "button", "status"):
        if action.get(key):
            return f"{kind}:{str(action[key])[:24]}"
    if "x" in action:
        return f"{kind}:{action['x']:.2f},{action.get('y', 0):.2f}"
    return kind


def print_table(
    con: sqlite3.Connection, block: int
) -> tuple[dict[tuple[str, str], list[int]], str | None]:
    """Print the per-task table; return each (task, column)'s rollout ids and the last eval's column."""
    outcomes: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    rollouts: dict[tuple[str, str], list[int]] = defaultdict(list)
    last_eval: int | None = None
    for rid, task, source, train_step, eval_step, success in con.execute(_ROLLOUTS):
        column = column_of(source, train_step, eval_step, block)
        outcomes[task][column].append(bool(success))
        rollouts[(task, column)].append(rid)
        if eval_step is not None and (last_eval is None or eval_step > last_eval):
            last_eval = eval_step
    columns = sorted({c for per_task in outcomes.values() for c in per_task}, key=_column_order)
    print(f"{'task':10}" + "".join(f"{c:>8}" for c in columns))
    for task in sorted(outcomes):
        cells = []
        for column in columns:
            played = outcomes[task].get(column)
            cells.append(f"{sum(played) / len(played):>7.0%} " if played else f"{'-':>7} ")
        print(f"{task:10}" + "".join(cells))
    return rollouts, None if last_eval is None else f"e{last_eval}"


def print_episodes(con: sqlite3.Connection, rollout_ids: list[int]) -> None:
    for rid in rollout_ids:
        turns = con.execute(
            "select action_json, parse_error, thinking from turn where rollout_id = ? order by turn",
            (rid,),
        ).fetchall()
        (summary,) = con.execute("select summary_json from rollout where id = ?", (rid,)).fetchone()
        end = json.loads(summary or "{}").get("end_reason", "?")
        actions = " | ".join(action_label(a, err) for a, err, _ in turns)
        thought = (turns[0][2] or "").strip().replace("\n", " ")[:60] if turns else ""
        print(f"  {end}: {actions}   [{thought}]")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path, help="the run's monitor.db (SQLite)")
    parser.add_argument("--block", type=int, default=10, help="training steps per column")
    parser.add_argument(
        "--show", default="", help="comma-separated task ids whose episodes to print"
    )
    args = parser.parse_args()
    if not args.db.is_file():
        parser.error(f"{args.db}: no such database file")
    if args.block < 1:
        parser.error("--block must be at least 1")
    con = sqlite3.connect(f"file:{args.db}?mode=ro", uri=True)
    try:
        rollouts, last_eval = print_table(con, args.block)
        for task in [t for t in args.show.split(",") if t]:
            for column in ("base", last_eval):
                if column and rollouts.get((task, column)):
                    print(f"== {task} {column}")
                    print_episodes(con, rollouts[(task, column)])
    finally:
        con.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
