"""Task sources: gym + file, filters, seeded split and limit, dataset rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cua_native.gym.protocol import Task
from cua_native.rollout.dataset import (
    TaskSource,
    TaskSourceError,
    load_tasks,
    parse_number_ranges,
    task_number,
    tasks_to_dataset,
)


def test_number_ranges() -> None:
    assert parse_number_ranges("001-032") == [(1, 32)]
    assert parse_number_ranges("1-4, 8,10-12") == [(1, 4), (8, 8), (10, 12)]
    for bad in ("a-b", "5-2", "", "1-", "1--3"):
        with pytest.raises(TaskSourceError):
            parse_number_ranges(bad)
    with pytest.raises(ValueError, match="bad number range"):
        TaskSource(number_range="x")


def test_task_number_sources() -> None:
    assert task_number(Task(task_id="task-011")) == 11
    assert task_number(Task(task_id="a", task_number="007")) == 7
    assert task_number(Task(task_id="b", meta={"number": 3})) == 3
    assert task_number(Task(task_id="none")) is None


async def test_gym_and_file_are_merged_and_filtered(toy, tmp_path: Path) -> None:
    extra = [
        {"task_id": "task-003", "instruction": "from the file", "tags": ["easy"]},
        {"meta": {"id": "file-010", "name": "ten"}, "description": "desc only", "tags": "x,y"},
    ]
    path = tmp_path / "tasks.yaml"
    path.write_text(yaml.safe_dump({"tasks": extra}))
    tasks = await load_tasks(TaskSource(file=path), toy)
    assert [t.task_id for t in tasks] == [
        "file-010",
        "task-001",
        "task-002",
        "task-003",
        "task-004",
        "task-005",
    ]
    by_id = {t.task_id: t for t in tasks}
    assert by_id["task-003"].instruction == "from the file"
    assert by_id["file-010"].prompt_text == "desc only" and by_id["file-010"].tags == ["x", "y"]

    easy = await load_tasks(TaskSource(file=path, tags="EASY"), toy)
    assert [t.task_id for t in easy] == ["task-001", "task-002", "task-003"]
    ranged = await load_tasks(TaskSource(number_range="002-004,10"), toy)
    assert [t.task_id for t in ranged] == ["task-002", "task-003", "task-004"]
    picked = await load_tasks(TaskSource(task_ids="task-005,task-001"), toy)
    assert [t.task_id for t in picked] == ["task-001", "task-005"]
    with pytest.raises(TaskSourceError, match="unknown task ids"):
        await load_tasks(TaskSource(task_ids=["task-404"]), toy)
    with pytest.raises(TaskSourceError, match="selects no task"):
        await load_tasks(TaskSource(number_range="900-999"), toy)


async def test_split_is_seeded_disjoint_and_complete(toy) -> None:
    toy.tasks = [Task(task_id=f"t{i:02d}") for i in range(20)]
    train = await load_tasks(TaskSource(split="train", eval_fraction=0.25, seed=1), toy)
    evals = await load_tasks(TaskSource(split="eval", eval_fraction=0.25, seed=1), toy)
    assert len(train) == 15 and len(evals) == 5
    assert {t.task_id for t in train}.isdisjoint({t.task_id for t in evals})
    again = await load_tasks(TaskSource(split="eval", eval_fraction=0.25, seed=1), toy)
    assert again == evals
    other = await load_tasks(TaskSource(split="eval", eval_fraction=0.25, seed=2), toy)
    assert other != evals
    counted = await load_tasks(TaskSource(split="eval", eval_count=3, seed=1), toy)
    assert len(counted) == 3
    limited = await load_tasks(TaskSource(split="train", eval_count=3, limit=4, seed=1), toy)
    assert len(limited) == 4 and {t.task_id for t in limited} <= {t.task_id for t in train} | {
        t.task_id for t in evals
    }


async def test_file_only_and_bad_files(tmp_path: Path) -> None:
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("\n".join(json.dumps({"task_id": f"j{i}"}) for i in range(3)) + "\n")
    tasks = await load_tasks(TaskSource(from_gym=False, file=jsonl), None)
    assert [t.task_id for t in tasks] == ["j0", "j1", "j2"]
    broken = tmp_path / "broken.json"
    broken.write_text('[{"name": "no id"}]')
    with pytest.raises(TaskSourceError, match="no 'task_id'"):
        await load_tasks(TaskSource(from_gym=False, file=broken), None)
    with pytest.raises(TaskSourceError, match="does not exist"):
        await load_tasks(TaskSource(from_gym=False, file=tmp_path / "missing.json"), None)
    with pytest.raises(TaskSourceError, match="needs a gym"):
        await load_tasks(TaskSource(), None)
    with pytest.raises(ValueError, match="needs from_gym"):
        TaskSource(from_gym=False)


async def test_dataset_rows(toy) -> None:
    tasks = await load_tasks(TaskSource(), toy)
    tasks[0].difficulty = "easy"
    data = tasks_to_dataset(tasks, gym_id="toy")
    assert len(data) == 5
    row = data[0]
    assert row["task_id"] == "task-001" and row["gym_id"] == "toy"
    assert row["instruction"] == "Click 1 times" and row["tags"] == ["easy"]
    assert row["difficulty"] == "easy" and row["task_number"] == 1
    restored = Task.model_validate_json(row["task"])
    assert restored == tasks[0] and restored.model_extra["target"] == 1
    assert data[1]["difficulty"] is None
    with pytest.raises(TaskSourceError, match="no gym_id"):
        tasks_to_dataset(tasks)
    with pytest.raises(TaskSourceError, match="no tasks"):
        tasks_to_dataset([], gym_id="toy")
    tagged = [Task(task_id="a", gym_id="sim")]
    assert tasks_to_dataset(tagged)[0]["gym_id"] == "sim"


def test_gym_seeds_copy_each_task_per_seed_and_survive_the_row() -> None:
    from cua_native.rollout.dataset import select_tasks, task_row
    from cua_native.rollout.workflow import task_from_row

    tasks = [Task(task_id=f"t{i}") for i in range(3)]
    chosen = select_tasks(tasks, TaskSource(task_ids=["t0", "t2"], gym_seeds=[7, 1000]))
    assert [(t.task_id, (t.model_extra or {})["gym_seed"]) for t in chosen] == [
        ("t0", 7),
        ("t2", 7),
        ("t0", 1000),
        ("t2", 1000),
    ]
    assert (task_from_row(task_row(chosen[3], gym_id="sim")).model_extra or {}) == {
        "gym_seed": 1000
    }
    assert all("gym_seed" not in (t.model_extra or {}) for t in select_tasks(tasks, TaskSource()))
