"""How much learning signal do a run's training groups carry, and what does the agent do?

Reads an embedded run's SQLite monitor database (read-only) and prints, over its training
groups: how many have equal success in every episode (GRPO gets no success signal from
them), in how many of those the default reward (success - ``--penalty`` x errors) differs
only through the format penalty, and in how many the sim's progress reward (the run must have
trained with ``cua.agent.gym.options.progress_reward`` = ``--weight``) still sees no
difference; then, per task, the success rate, the progress of failed episodes and the first
action the agent took.

    uv run python bench/experiments/group_signal.py runs/default/monitor.db --weight 0.5

A run with ``actor.optimizer.lr=0`` samples the warm start's policy without changing it, so
its groups measure the starting signal of each reward.
"""

from __future__ import annotations

import argparse
import re
import sqlite3
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Episode:
    group: str
    task: str
    success: bool
    reward: float
    errors: int
    first_action: str

    def progress(self, weight: float, penalty: float) -> float:
        """The share of the solution path covered, recovered from the shaped reward."""
        if self.success:
            return 1.0
        return round((self.reward + penalty * self.errors) / weight, 3)


_OPEN = re.compile(r'"action":\s*"open",\s*"text":\s*"([^"]*)"')


def first_action(response: str | None, parse_error: str | None) -> str:
    if parse_error:
        return "unparseable"
    found = _OPEN.search(response or "")
    if found:
        return f"open {found[1]}"
    action = re.search(r'"action":\s*"([a-z_]+)"', response or "")
    return action[1] if action else "other"


def load(db: Path) -> list[Episode]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "select r.id, r.[group], t.name, r.task_success, r.reward,"
            " coalesce(r.parse_errors, 0) + coalesce(r.tool_name_errors, 0)"
            " + coalesce(r.tool_arg_errors, 0)"
            " from rollout r join task t on t.id = r.task_id"
            " where r.status = 'completed' and r.is_eval = 0 and r.baseline_id is null"
        ).fetchall()
        firsts = {
            rollout: first_action(text, error)
            for rollout, text, error in con.execute(
                "select rollout_id, model_response, parse_error from turn where turn = 1"
            )
        }
    finally:
        con.close()
    return [
        Episode(str(group), name, bool(ok), float(reward), int(errors), firsts.get(rid, "-"))
        for rid, group, name, ok, reward, errors in rows
    ]


def equal(values: list[float] | list[int] | list[bool]) -> bool:
    return len(set(values)) <= 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path, help="the run's monitor.db")
    parser.add_argument("--weight", type=float, default=0.5, help="the run's progress_reward")
    parser.add_argument("--penalty", type=float, default=0.05, help="the run's format_penalty")
    args = parser.parse_args()
    episodes = load(args.db)
    if not episodes:
        raise SystemExit(f"{args.db}: no completed training episodes")
    groups: dict[str, list[Episode]] = defaultdict(list)
    for episode in episodes:
        groups[episode.group].append(episode)
    flat_success = [g for g in groups.values() if equal([e.success for e in g])]
    format_only = [g for g in flat_success if not equal([e.errors for e in g])]
    flat_progress = [
        g for g in flat_success if equal([e.progress(args.weight, args.penalty) for e in g])
    ]
    n = len(groups)
    rate = sum(e.success for e in episodes) / len(episodes)
    print(f"{n} training groups, {len(episodes)} episodes, success {rate:.0%}")
    print(
        f"  equal success in every episode:            {len(flat_success):>3} ({len(flat_success) / n:.0%})"
    )
    print(f"    of which the default reward differs only by format: {len(format_only)}")
    print(f"    of which progress is equal too:                     {len(flat_progress)}")
    print()
    by_task: dict[str, list[Episode]] = defaultdict(list)
    for episode in episodes:
        by_task[episode.task].append(episode)
    for task, runs in sorted(by_task.items()):
        progress = sorted(e.progress(args.weight, args.penalty) for e in runs if not e.success)
        shown = ", ".join(f"{p:.2f}" for p in progress)
        firsts = Counter(e.first_action for e in runs).most_common(3)
        print(
            f"{task:<28} n={len(runs):>2} success {sum(e.success for e in runs) / len(runs):>4.0%}"
            f"  first action {dict(firsts)}  failed episodes' progress [{shown}]"
        )


if __name__ == "__main__":
    main()
