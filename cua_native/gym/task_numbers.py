"""Task numbers: the short numeric names ("007", "7") people and older clients use for tasks.

A task's number is its ``task_number``, else its ``meta.number``, else the last run of digits
in its id (``sim-007`` is 7). The gym server writes it into every task it serves, as the
predecessor's gym did (``task_number`` and ``meta.number``, strings such as ``"007"``), so a
client that picks tasks by number finds the right one; and it resolves a numeric task name
that is no task id to the one task of that number (``docs/gym_protocol.md``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from cua_native.gym.protocol import Task

_DIGITS = re.compile(r"\d+")


def number_text(task: Task) -> str | None:
    """The task's number as written: ``task_number``, ``meta.number``, or the id's last run of
    digits (``"007"``); ``None`` when it has none."""
    extra = task.model_extra or {}
    meta = extra.get("meta")
    for value in (extra.get("task_number"), meta.get("number") if isinstance(meta, dict) else None):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return str(value)
        if isinstance(value, str) and value.strip().isdigit():
            return value.strip()
    digits = _DIGITS.findall(task.task_id)
    return digits[-1] if digits else None


def task_number(task: Task) -> int | None:
    """``number_text`` as an integer (``"007"`` is 7)."""
    text = number_text(task)
    return int(text) if text is not None else None


def numbered_json(task: Task) -> dict[str, Any]:
    """The task's wire JSON with its number as ``task_number`` and ``meta.number`` (strings),
    where the task does not set them itself; a ``meta`` that is not an object is left alone."""
    data = task.model_dump(mode="json")
    text = number_text(task)
    if text is None:
        return data
    data.setdefault("task_number", text)
    meta = data.setdefault("meta", {})
    if isinstance(meta, dict):
        meta.setdefault("number", text)
    return data


def by_number(tasks: Iterable[Task], name: str) -> Task | None:
    """The one task whose number is ``name`` (digits only: ``"7"``, ``"007"``); ``None`` when
    ``name`` is not a number or no task has it; ``LookupError`` when several do."""
    if not name.isdigit():
        return None
    wanted = int(name)
    found = [task for task in tasks if task_number(task) == wanted]
    if len(found) > 1:
        names = ", ".join(sorted(t.task_id for t in found))
        raise LookupError(f"task number {name} is ambiguous: {names}")
    return found[0] if found else None
