"""A step's running tallies (``tally.py``) equal the figures aggregated from its rollouts, through
every way a rollout changes, and a batch's work does not grow with the step it writes to."""

from __future__ import annotations

import random
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import event, select

from cua_native.monitor.db.schema import Rollout, Step, StepGroup
from cua_native.monitor.db.store import MonitorStore
from cua_native.monitor.db.tally import TERMINAL_ROLLOUT

STATUSES = ("pending", "running", "completed", "failed", "cancelled", None)


def _setup(store: MonitorStore) -> None:
    store.ingest(
        {
            "training": {
                "client_id": "tr",
                "run_name": "tally-run",
                "log_path": "/tmp/tally",
                "model_name": "m",
                "status": "running",
            },
            "tasks": [{"client_id": "task", "task_id": "t", "name": "T", "description": "d"}],
            "steps": [
                {"client_id": f"step-{n}", "training_client_id": "tr", "step": n} for n in (0, 1)
            ],
            "evals": [
                {"client_id": "eval-0", "training_client_id": "tr", "step": 0, "model_path": "m"}
            ],
        }
    )


def _random_record(rng: random.Random, known: list[str]) -> dict[str, Any]:
    """A new rollout, or an update of a known one changing what a step's figures depend on."""
    if not known or rng.random() < 0.3:
        client_id = f"r{len(known)}"
        known.append(client_id)
        return {
            "client_id": client_id,
            "rollout_id": client_id,
            "step_client_id": rng.choice(("step-0", "step-1")),
            "task_client_id": "task",
            "model_path": "m",
            **_group(rng),
            "status": rng.choice(STATUSES),
            "reward": rng.choice((None, 0.0, 1.0, 0.25, -0.5)),
        }
    record: dict[str, Any] = {"client_id": rng.choice(known)}
    change = rng.randrange(5)
    if change == 0:
        record["status"] = rng.choice(STATUSES)
    elif change == 1:
        record["reward"] = rng.choice((None, 0.0, 1.0, 0.75, 3.5))
    elif change == 2:
        record.update(_group(rng))
    elif change == 3:  # moves to the other step, or to an eval and back
        record[rng.choice(("step_client_id", "step_client_id", "eval_client_id"))] = rng.choice(
            ("step-0", "step-1")
        )
        if "eval_client_id" in record:
            record["eval_client_id"] = "eval-0"
    else:
        record.update(status=rng.choice(STATUSES), reward=rng.random())
    return record


def _group(rng: random.Random) -> dict[str, Any]:
    kind = rng.randrange(4)
    if kind == 0:
        return {"group": rng.randrange(3), "group_id": None}
    if kind == 1:
        return {"group_id": f"g{rng.randrange(2)}", "group": None}
    if kind == 2:  # group_id "1" and group number 1 are one group
        return {"group_id": "1", "group": None}
    return {"group": None, "group_id": None}


def _expected(store: MonitorStore) -> tuple[dict[int, dict[str, Any]], dict[tuple[int, str], int]]:
    """Per step: the tallies aggregated from its rollouts now; per (step, group): open count."""
    with store.session() as session:
        rows = session.execute(
            select(
                Rollout.step_id,
                Rollout.source_type,
                Rollout.status,
                Rollout.reward,
                Rollout.group_id,
                Rollout.group,
            )
        ).all()
        steps = session.scalars(select(Step.id)).all()
    groups: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    rewards: dict[int, list[float]] = defaultdict(list)
    finished: dict[int, int] = defaultdict(int)
    total: dict[int, int] = defaultdict(int)
    for step_id, source, status, reward, group_id, group in rows:
        if source != "step":
            continue
        key = group_id if group_id is not None else None if group is None else str(group)
        counts = groups[(step_id, "-" if key is None else f"g:{key}")]
        counts[0] += 1
        counts[1] += status is not None and status not in TERMINAL_ROLLOUT
        total[step_id] += 1
        if status in TERMINAL_ROLLOUT:
            finished[step_id] += 1
            if reward is not None:
                rewards[step_id].append(reward)
    expected = {
        step: {
            "tally_rollouts": total[step],
            "tally_finished": finished[step],
            "tally_rewarded": len(rewards[step]),
            "tally_reward_sum": sum(rewards[step]),
            "tally_reward_squares": sum(r * r for r in rewards[step]),
            "tally_groups": sum(1 for (s, _) in groups if s == step),
            "tally_complete_groups": sum(
                1 for (s, _), c in groups.items() if s == step and not c[1]
            ),
        }
        for step in steps
    }
    return expected, {key: counts[1] for key, counts in groups.items()}


def _check(store: MonitorStore, label: str) -> None:
    expected, open_by_group = _expected(store)
    with store.session() as session:
        for step in session.scalars(select(Step)):
            tallies = {name: getattr(step, name) for name in expected[step.id]}
            for name, value in expected[step.id].items():
                assert tallies[name] == pytest.approx(value, abs=1e-9), (label, step.id, name)
            if expected[step.id]["tally_rewarded"]:
                mean = expected[step.id]["tally_reward_sum"] / expected[step.id]["tally_rewarded"]
                assert step.reward_mean == pytest.approx(mean), label
        stored = {
            (g.step_id, g.group_key): g.open_rollouts
            for g in session.scalars(select(StepGroup).where(StepGroup.rollouts > 0))
        }
    assert stored == open_by_group, label


@pytest.mark.parametrize("seed", [1, 2])
def test_tallies_equal_the_aggregate_after_random_batches(store: MonitorStore, seed: int) -> None:
    """New rollouts, status/reward/group changes, moves between steps and to an eval, records
    sent twice in a batch, batches retried, and finally a failed training closing its open
    rollouts: after every batch the tallies equal the aggregate over the rollouts."""
    rng = random.Random(seed)
    _setup(store)
    known: list[str] = []
    for number in range(40):
        batch = {"rollouts": [_random_record(rng, known) for _ in range(rng.randrange(1, 7))]}
        store.ingest(batch)
        if number % 7 == 3:  # a retry after a lost acknowledgement
            store.ingest(batch)
        _check(store, f"batch {number}")
    store.ingest(
        {
            "training": {"client_id": "tr", "status": "failed"},
            "rollouts": [_random_record(rng, known)],
        }
    )
    _check(store, "after the training failed")
    with store.session() as session:
        statuses = set(session.scalars(select(Rollout.status)))
    assert not statuses & {"pending", "running", None}


def _episodes(start: int, count: int) -> dict[str, list[Any]]:
    batch: dict[str, list[Any]] = {"environments": [], "rollouts": [], "turns": []}
    for index in range(start, start + count):
        rollout = f"ep-{index}"
        batch["environments"].append(
            {"client_id": f"{rollout}:env", "env_type": "sim", "status": "terminated"}
        )
        batch["rollouts"].append(
            {
                "client_id": rollout,
                "rollout_id": rollout,
                "step_client_id": "step-0",
                "task_client_id": "task",
                "env_client_id": f"{rollout}:env",
                "model_path": "m",
                "group_num": index // 8,
                "max_turns": 3,
                "status": "completed",
                "reward": float(index % 2),
            }
        )
        batch["turns"].extend(
            {"client_id": f"{rollout}:{t}", "rollout_client_id": rollout, "turn": t}
            for t in range(1, 4)
        )
    return batch


def test_a_batch_costs_the_same_whatever_the_steps_size(tmp_path: Any) -> None:
    """SQLite's virtual-machine instructions (each row a statement visits costs some) for one
    batch of 20 episodes into a step of 40 rollouts and into the same step at 960: equal within
    2 % (they differ by 0.1 %; aggregating the step's rollouts on every batch, as the store did
    before its tallies, made it 20,819 against 105,804). An index seek is one instruction
    whatever the table's size."""
    store = MonitorStore.open(None, run_dir=tmp_path)
    instructions = [0]

    def count() -> int:
        instructions[0] += 1
        return 0

    def attach(dbapi_connection: Any, *_: Any) -> None:
        dbapi_connection.set_progress_handler(count, 1)

    try:
        _setup(store)
        event.listen(store.engine, "checkout", attach)
        cost: list[int] = []
        for batch in range(50):
            instructions[0] = 0
            store.ingest(_episodes(20 * batch, 20))
            cost.append(instructions[0])
    finally:
        store.close()
    # batches 2 and 48 start at the same place in the groups of 8 (40 rollouts = 5 groups)
    assert cost[48] <= 1.02 * cost[2], f"{cost[2]} instructions at 40 rollouts, {cost[48]} at 960"


def test_tallies_hold_with_two_writers_at_once(db_url: str, tmp_path: Any) -> None:
    """Two stores (as two processes would) update the same rollouts at the same time: whatever
    the interleaving, every change is counted once (row locks, ``tally.py``)."""
    first = MonitorStore.open(db_url, run_dir=tmp_path / "a")
    second = MonitorStore.open(db_url, run_dir=tmp_path / "b")
    try:
        _setup(first)
        rollouts = [
            {
                "client_id": f"r{i}",
                "rollout_id": f"r{i}",
                "step_client_id": "step-0",
                "task_client_id": "task",
                "model_path": "m",
                "group": i % 3,
                "status": "running",
            }
            for i in range(8)
        ]
        first.ingest({"rollouts": rollouts})

        def write(store: MonitorStore, seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(25):
                batch = [
                    {
                        "client_id": f"r{rng.randrange(8)}",
                        "status": rng.choice(STATUSES),
                        "reward": rng.choice((None, 0.0, 1.0, 0.5)),
                        **_group(rng),
                    }
                    for _ in range(rng.randrange(1, 5))
                ]
                store.ingest({"rollouts": batch})

        with ThreadPoolExecutor(max_workers=2) as pool:
            for future in [pool.submit(write, first, 1), pool.submit(write, second, 2)]:
                future.result(timeout=600)
        _check(first, "after two writers")
    finally:
        first.close()
        second.close()
