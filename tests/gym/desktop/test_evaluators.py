"""The task file and the evaluator subset (pure: no desktop)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cua_native.actions.models import Answer, Terminate
from cua_native.gym.desktop.client import DesktopClient, DesktopTimeouts
from cua_native.gym.desktop.demos import DEMONSTRATIONS
from cua_native.gym.desktop.evaluators import (
    check_include_exclude,
    evaluate,
    exact_match,
    ods_cell,
    ods_cell_equals,
)
from cua_native.gym.desktop.tasks import DEFAULT_TASK_FILE, TaskFileError, load_tasks
from cua_native.gym.protocol import FAIL_ANSWER, final_answer

BLANK = DEFAULT_TASK_FILE.parent / "files" / "blank.ods"


def test_the_shipped_tasks_load_with_their_config_and_evaluator() -> None:
    tasks = load_tasks(DEFAULT_TASK_FILE)
    assert len(tasks) == 38
    infeasible = {t.task_id for t in tasks if t.model_extra["evaluator"]["func"] == "infeasible"}
    assert len(infeasible) == 4 and all(
        "infeasible" in t.tags for t in tasks if t.task_id in infeasible
    )
    apps = {t.app for t in tasks}
    assert apps == {"terminal", "text editor", "file manager", "calculator", "libreoffice calc"}
    for task in tasks:
        assert task.instruction and task.model_extra is not None
        assert task.model_extra["evaluator"]["func"]


def test_every_shipped_task_has_a_demonstration() -> None:
    """``test_real_desktops`` plays each one on the real app; a task without one is unproven."""
    assert sorted(DEMONSTRATIONS) == sorted(t.task_id for t in load_tasks(DEFAULT_TASK_FILE))


def _first_task_with_metric(tmp_path: Path, func: str) -> Path:
    """A task file of the first shipped task, its evaluator's metric set to ``func``."""
    bad = json.loads(DEFAULT_TASK_FILE.read_text())[:1]
    bad[0]["evaluator"]["func"] = func
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(bad))
    return path


def test_an_unsupported_metric_is_one_line_naming_the_task(tmp_path: Path) -> None:
    path = _first_task_with_metric(tmp_path, "compare_table")
    with pytest.raises(TaskFileError, match="terminal_hello_file: metric 'compare_table'"):
        load_tasks(path)


def test_text_metrics() -> None:
    assert exact_match(b"hello desktop\n", {"expected": "hello desktop"})[0] == 1.0
    assert exact_match(None, {"expected": "x"})[0] == 0.0
    assert exact_match("hello", {"expected": "hello desktop"})[0] == 0.0
    assert check_include_exclude("a b", {"include": ["a"], "exclude": ["c"]})[0] == 1.0
    assert check_include_exclude("a b c", {"include": ["a"], "exclude": ["c"]})[0] == 0.0


def test_ods_cells_of_libreoffice_blank_sheet() -> None:
    data = BLANK.read_bytes()
    assert ods_cell(data, "A1") is None
    assert ods_cell_equals(data, {"cell": "A1", "expected": 42})[0] == 0.0
    assert ods_cell_equals(b"not a zip", {"cell": "A1", "expected": 42})[0] == 0.0
    assert ods_cell_equals(None, {"cell": "A1", "expected": 42})[0] == 0.0


def test_the_final_action_becomes_the_answer_evaluate_reads() -> None:
    assert final_answer(Terminate(status="failure")) == FAIL_ANSWER
    assert final_answer(Terminate(status="success")) is None
    assert final_answer(Answer(text="42")) == "42"


async def test_infeasible_tasks_are_judged_by_the_final_action_alone() -> None:
    """OSWorld's contract: an ``infeasible`` task succeeds exactly when the agent declared it
    infeasible, and that declaration fails every other task. Neither reads the desktop: the
    client points at nothing, so a getter's call would raise ``DesktopUnavailable``."""
    feasible = json.loads(DEFAULT_TASK_FILE.read_text())[0]["evaluator"]
    gone = DesktopClient(
        "http://127.0.0.1:9", timeouts=DesktopTimeouts(connect=0.5, read=0.5, execute=0.5)
    )
    try:
        infeasible = {"func": "infeasible"}
        assert (await evaluate(infeasible, gone, FAIL_ANSWER)).success
        assert not (await evaluate(infeasible, gone, None)).success
        assert not (await evaluate(infeasible, gone, "it cannot be done")).success
        declared = await evaluate(feasible, gone, FAIL_ANSWER)
        assert (declared.reward, declared.success) == (0.0, False)
    finally:
        await gone.aclose()


def test_an_infeasible_evaluator_takes_no_getters(tmp_path: Path) -> None:
    path = _first_task_with_metric(tmp_path, "infeasible")
    with pytest.raises(TaskFileError, match="terminal_hello_file: an 'infeasible' evaluator"):
        load_tasks(path)
