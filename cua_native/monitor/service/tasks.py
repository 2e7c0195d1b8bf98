"""Which tasks does a run learn, lose or never solve? One row per task from its monitor database.

Reads a run's SQLite monitor database (read-only) and prints, for one training (the latest
unless ``--training`` names a run), per task the success rate of its finished episodes in the
baseline evaluation (``base``), in the training batches by block of ``--block`` steps (``t00``
= steps 0-9, ...) and in each evaluation (``e9`` = after step 9); ``-`` where the task has no
finished episode there (unseen tasks in training, or a block still in flight). With ``--show
TASK,...`` it then prints the actions of every baseline and last-evaluation episode of those
tasks, one line each: how it ended, its actions in order, and the first thought.

    uv run python -m cua_native.monitor tasks runs/default/monitor.db --show sim-009,sim-010

``bench/experiments/group_signal.py`` answers the other question about the same database: how much
signal the training groups carry.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections import defaultdict
from pathlib import Path

# A rollout belongs to its training through its step, evaluation or baseline.
_ROLLOUTS = """
select r.id, t.task_id, r.source_type, s.step, e.step, r.task_success
from rollout r
join task t on t.id = r.task_id
left join step s on s.id = r.step_id
left join eval e on e.id = r.eval_id
left join baseline b on b.id = r.baseline_id
where r.status = 'completed'
  and coalesce(s.training_id, e.training_id, b.training_id) = ?
order by r.id
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
    for key in ("name", "text", "button", "status", "direction"):
        if action.get(key):
            return f"{kind}:{str(action[key])[:24]}"
    if isinstance(action.get("keys"), list) and action["keys"]:
        return f"{kind}:{'+'.join(map(str, action['keys']))[:24]}"
    x, y = action.get("x"), action.get("y")
    if isinstance(x, int | float) and isinstance(y, int | float):
        return f"{kind}:{x:.2f},{y:.2f}"
    return kind


def pick_training(con: sqlite3.Connection, run_name: str | None) -> tuple[int, str]:
    """The training to show: the one named ``run_name``, else the latest."""
    query = "select id, run_name from training"
    rows = con.execute(
        query + (" where run_name = ? order by id desc" if run_name else " order by id desc"),
        (run_name,) if run_name else (),
    ).fetchall()
    if not rows:
        raise LookupError(f"no training named {run_name!r}" if run_name else "no training")
    return rows[0][0], rows[0][1]


def table(
    con: sqlite3.Connection, training: int, block: int
) -> tuple[dict[str, dict[str, list[bool]]], dict[tuple[str, str], list[int]], str | None]:
    """Per task and column the outcomes; each (task, column)'s rollout ids; the last eval's column."""
    outcomes: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    rollouts: dict[tuple[str, str], list[int]] = defaultdict(list)
    last_eval: int | None = None
    for rid, task, source, train_step, eval_step, success in con.execute(_ROLLOUTS, (training,)):
        column = column_of(source, train_step, eval_step, block)
        outcomes[task][column].append(bool(success))
        rollouts[(task, column)].append(rid)
        if eval_step is not None and (last_eval is None or eval_step > last_eval):
            last_eval = eval_step
    return outcomes, rollouts, None if last_eval is None else f"e{last_eval}"


def print_table(outcomes: dict[str, dict[str, list[bool]]]) -> None:
    columns = sorted({c for per_task in outcomes.values() for c in per_task}, key=_column_order)
    print(f"{'task':10}" + "".join(f"{c:>8}" for c in columns))
    for task in sorted(outcomes):
        cells = []
        for column in columns:
            played = outcomes[task].get(column)
            cells.append(f"{sum(played) / len(played):>7.0%} " if played else f"{'-':>7} ")
        print(f"{task:10}" + "".join(cells))


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``tasks`` command's arguments (``python -m cua_native.monitor tasks``)."""
    parser.add_argument("db", type=Path, help="the run's monitor.db (SQLite)")
    parser.add_argument("--block", type=int, default=10, help="training steps per column")
    parser.add_argument(
        "--show", default="", help="comma-separated task ids whose episodes to print"
    )
    parser.add_argument("--training", help="the run name of the training to show (default: latest)")


def run(args: argparse.Namespace) -> int:
    """Print the table (and the ``--show`` tasks' episodes); 2 on bad input, 1 on an empty run."""
    if not args.db.is_file():
        print(f"error: {args.db}: no such database file", file=sys.stderr)
        return 2
    if args.block < 1:
        print("error: --block must be at least 1", file=sys.stderr)
        return 2
    con = sqlite3.connect(f"file:{args.db}?mode=ro", uri=True)
    try:
        training, run_name = pick_training(con, args.training)
        outcomes, rollouts, last_eval = table(con, training, args.block)
        if not outcomes:
            print(f"tasks: training {run_name!r} has no finished episodes", file=sys.stderr)
            return 1
        print(f"training {run_name!r}, finished episodes only")
        print_table(outcomes)
        for task in [t for t in args.show.split(",") if t]:
            if task not in outcomes:
                print(f"tasks: {task}: no finished episodes in this training", file=sys.stderr)
                continue
            for column in ("base", last_eval):
                if column and rollouts.get((task, column)):
                    print(f"== {task} {column}")
                    print_episodes(con, rollouts[(task, column)])
    except (sqlite3.DatabaseError, LookupError) as error:
        print(f"tasks: {args.db}: {error}", file=sys.stderr)
        return 2
    finally:
        con.close()
    return 0
