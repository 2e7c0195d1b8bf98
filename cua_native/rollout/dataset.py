"""Task sources → ``datasets.Dataset`` rows for the rollout workflow.

Tasks come from a gym (``list_tasks``), from a JSON/JSONL/YAML file, or both (deduplicated by
``task_id``; a file entry replaces the gym's). Then, in order: filters (ids, tags, number ranges),
a seeded train/eval split, a seeded limit.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any, Literal

import datasets
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cua_native.gym.protocol import Gym, Task
from cua_native.gym.task_numbers import task_number
from cua_native.gym.wire import WireError, task_to_json, tasks_from_json

_RANGE_PART = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


class TaskSourceError(ValueError):
    """A task source is misconfigured or selects no task."""


def parse_number_ranges(spec: str) -> list[tuple[int, int]]:
    """``"001-032"``, ``"5"`` or ``"1-4,8,10-12"`` → inclusive ``(low, high)`` pairs."""
    ranges = []
    for part in spec.split(","):
        match = _RANGE_PART.match(part)
        if not match:
            raise TaskSourceError(f"bad number range {part.strip()!r} in {spec!r} (use '001-032')")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise TaskSourceError(f"number range {part.strip()!r} runs backwards")
        ranges.append((low, high))
    return ranges


class TaskSource(BaseModel):
    model_config = ConfigDict(extra="forbid")

    from_gym: bool = True
    file: Path | None = None
    """JSON (list or ``{"tasks": [...]}``), JSONL (one task per line) or YAML."""
    task_ids: list[str] | None = None
    tags: list[str] | None = None
    """Keep tasks with ANY of these tags (case-insensitive)."""
    number_range: str | None = None
    """Keep tasks whose number is in ``"001-032"`` / ``"1-4,8"`` (see ``task_number``)."""
    split: Literal["all", "train", "eval"] = "all"
    eval_fraction: float = Field(0.2, ge=0.0, le=1.0)
    eval_count: int | None = Field(None, ge=0)
    """Overrides ``eval_fraction`` when set."""
    seed: int = 42
    limit: int | None = Field(None, ge=1)
    gym_seeds: list[int] | None = None
    """Play every selected task under each of these gym seeds: one copy of the task per seed,
    with ``gym_seed`` set (the simulator seeds the phone's data with it). A fixed evaluation
    set on fresh phones of the training tasks is ``gym_seeds: [1000]``."""

    @field_validator("task_ids", "tags", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("number_range")
    @classmethod
    def _valid_range(cls, value: str | None) -> str | None:
        if value is not None:
            parse_number_ranges(value)
        return value

    @model_validator(mode="after")
    def _has_origin(self) -> TaskSource:
        if not self.from_gym and self.file is None:
            raise ValueError("a task source needs from_gym=True, a file, or both")
        return self

    def narrowed_to(self, selection: str) -> TaskSource:
        """This source with its filters (ids, tags, numbers, split, limit) replaced by
        ``selection`` (a command's ``--tasks``): task numbers as ``number_range`` reads them
        (``1-3,8``; ``sim-001`` is 1) or task ids (``sim-001,sim-004``), not both. Its origin
        and gym seeds stay. ``TaskSourceError`` (one line) on a bad selection."""
        items = [item.strip() for item in selection.split(",") if item.strip()]
        if not items:
            raise TaskSourceError(f"{selection!r} selects no task")
        numeric = [item for item in items if re.fullmatch(r"[\d\s-]+", item)]
        update: dict[str, Any] = {
            "task_ids": None,
            "tags": None,
            "number_range": None,
            "split": "all",
            "limit": None,
        }
        if len(numeric) == len(items):
            update["number_range"] = ",".join(items)
            parse_number_ranges(update["number_range"])
        elif numeric:
            raise TaskSourceError(f"{selection!r} mixes task numbers and task ids; use one")
        else:
            update["task_ids"] = items
        return self.model_copy(update=update)


def load_task_file(path: Path) -> list[Task]:
    if not path.is_file():
        raise TaskSourceError(f"task file {str(path)!r} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".jsonl":
            data: Any = [json.loads(line) for line in text.splitlines() if line.strip()]
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
        return tasks_from_json(data)
    except (ValueError, yaml.YAMLError, WireError) as exc:
        raise TaskSourceError(f"task file {str(path)!r}: {exc}") from exc


def select_tasks(tasks: list[Task], source: TaskSource) -> list[Task]:
    """Filters, split and limit (pure; ``load_tasks`` without the I/O)."""
    chosen = sorted(tasks, key=lambda t: t.task_id)
    if source.task_ids is not None:
        wanted = set(source.task_ids)
        unknown = wanted - {t.task_id for t in chosen}
        if unknown:
            raise TaskSourceError(f"unknown task ids: {sorted(unknown)}")
        chosen = [t for t in chosen if t.task_id in wanted]
    if source.tags:
        wanted_tags = {t.lower() for t in source.tags}
        chosen = [t for t in chosen if wanted_tags & {tag.lower() for tag in t.tags}]
    if source.number_range:
        ranges = parse_number_ranges(source.number_range)
        chosen = [
            t
            for t in chosen
            if (n := task_number(t)) is not None and any(lo <= n <= hi for lo, hi in ranges)
        ]
    if source.split != "all":
        shuffled = list(chosen)
        random.Random(source.seed).shuffle(shuffled)
        n_eval = (
            min(source.eval_count, len(shuffled))
            if source.eval_count is not None
            else round(len(shuffled) * source.eval_fraction)
        )
        part = shuffled[:n_eval] if source.split == "eval" else shuffled[n_eval:]
        ids = {t.task_id for t in part}
        chosen = [t for t in chosen if t.task_id in ids]
    if source.limit is not None and source.limit < len(chosen):
        ids = {t.task_id for t in random.Random(source.seed).sample(chosen, source.limit)}
        chosen = [t for t in chosen if t.task_id in ids]
    if not chosen:
        raise TaskSourceError(f"the task source selects no task ({len(tasks)} before filters)")
    if source.gym_seeds is not None:
        chosen = [t.model_copy(update={"gym_seed": s}) for s in source.gym_seeds for t in chosen]
    return chosen


async def load_tasks(source: TaskSource, gym: Gym | None) -> list[Task]:
    """Tasks of ``source``, sorted by ``task_id``. ``gym`` may be ``None`` with a file only."""
    by_id: dict[str, Task] = {}
    if source.from_gym:
        if gym is None:
            raise TaskSourceError("from_gym=True needs a gym")
        for task in await gym.list_tasks():
            by_id.setdefault(task.task_id, task)
    if source.file is not None:
        for task in load_task_file(source.file):
            by_id[task.task_id] = task
    return select_tasks(list(by_id.values()), source)


DATASET_FEATURES = datasets.Features(
    {
        "task_id": datasets.Value("string"),
        "name": datasets.Value("string"),
        "instruction": datasets.Value("string"),
        "description": datasets.Value("string"),
        "task": datasets.Value("string"),
        "gym_id": datasets.Value("string"),
        "tags": datasets.Sequence(datasets.Value("string")),
        "difficulty": datasets.Value("string"),
        "category": datasets.Value("string"),
        "max_steps": datasets.Value("int64"),
        "task_number": datasets.Value("int64"),
    }
)


def task_row(task: Task, gym_id: str | None = None) -> dict[str, Any]:
    """One dataset row; ``task`` is the full task as JSON (``Task.model_validate_json`` reads it
    back, unknown fields included). ``gym_id``: the argument, else the task's own ``gym_id``."""
    gym_id = gym_id or (task.model_extra or {}).get("gym_id")
    if not isinstance(gym_id, str) or not gym_id:
        raise TaskSourceError(f"task {task.task_id!r} has no gym_id (pass gym_id=...)")
    return {
        "task_id": task.task_id,
        "name": task.name,
        "instruction": task.prompt_text,
        "description": task.description,
        "task": json.dumps(task_to_json(task), ensure_ascii=False, sort_keys=True),
        "gym_id": gym_id,
        "tags": list(task.tags),
        "difficulty": task.difficulty,
        "category": task.category,
        "max_steps": task.max_steps,
        "task_number": task_number(task),
    }


def tasks_to_dataset(tasks: list[Task], gym_id: str | None = None) -> datasets.Dataset:
    """One row per task (see ``task_row``); every row needs a gym id."""
    if not tasks:
        raise TaskSourceError("no tasks to turn into a dataset")
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise TaskSourceError("duplicate task ids in the dataset")
    return datasets.Dataset.from_list(
        [task_row(t, gym_id) for t in tasks], features=DATASET_FEATURES
    )
