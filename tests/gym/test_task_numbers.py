"""Task numbers over the real HTTP server: every served task carries its number, a numeric task
name resolves to the task of that number (or is a clear 404), and the predecessor's own
client (vendored, run unchanged) starts the task a numeric hint names, not the first one."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from cua_native.gym.protocol import Task
from cua_native.gym.server import create_app
from cua_native.gym.sim import SimGym
from cua_native.gym.task_numbers import by_number, number_text, numbered_json, task_number

VENDORED = Path(__file__).parents[1] / "monitor" / "contract" / "vendored"


def test_numbers_come_from_the_task_then_its_meta_then_its_id() -> None:
    assert number_text(Task(task_id="sim-007")) == "007" and task_number(Task(task_id="x-7")) == 7
    assert number_text(Task(task_id="a-1", task_number="011")) == "011"
    assert number_text(Task(task_id="a-1", task_number=12)) == "12"
    assert number_text(Task(task_id="a-1", meta={"number": "013"})) == "013"
    assert number_text(Task(task_id="none")) is None
    assert numbered_json(Task(task_id="none")) == Task(task_id="none").model_dump(mode="json")
    data = numbered_json(Task(task_id="sim-007", meta={"id": "x"}))
    assert data["task_number"] == "007" and data["meta"] == {"id": "x", "number": "007"}
    kept = numbered_json(Task(task_id="a-5", task_number="9", meta="opaque"))
    assert kept["task_number"] == "9" and kept["meta"] == "opaque"


def test_by_number_finds_one_task_or_says_why_not() -> None:
    tasks = [Task(task_id="sim-001"), Task(task_id="sim-007"), Task(task_id="b", task_number="7")]
    assert by_number(tasks[:2], "7") == tasks[1] and by_number(tasks[:2], "007") == tasks[1]
    assert by_number(tasks[:2], "8") is None and by_number(tasks[:2], "sim-7") is None
    with pytest.raises(LookupError, match="task number 7 is ambiguous: b, sim-007"):
        by_number(tasks, "7")


async def test_served_tasks_carry_their_number_and_numbers_resolve(serve) -> None:
    sim = SimGym(seed=0)
    async with serve(create_app({sim.gym_id: sim})) as url:
        async with httpx.AsyncClient(base_url=f"{url}/api/v1/sim", timeout=60) as client:
            listed = (await client.get("/tasks")).json()["tasks"]
            assert all(t["task_number"] == t["task_id"][-3:] for t in listed)
            assert all(t["meta"]["number"] == t["task_number"] for t in listed)
            for name in ("7", "007", "sim-007"):
                task = (await client.get(f"/tasks/{name}")).json()
                assert (task["task_id"], task["task_number"]) == ("sim-007", "007")
            created = await client.post("/tasks/7", json={"options": {}})
            assert created.status_code == 200 and created.json()["task_id"] == "sim-007"
            execution = created.json()["execution_id"]
            assert (await client.post(f"/executions/{execution}/terminate")).status_code == 200
            for name in ("999", "0", "seven"):
                missing = await client.post(f"/tasks/{name}", json={"options": {}})
                detail = missing.json()["detail"]
                assert missing.status_code == 404 and f"unknown task {name!r}" in detail
    assert sim.live_executions == 0


async def test_an_ambiguous_number_is_refused(serve, toy) -> None:
    toy.tasks.append(Task(task_id="other", task_number="004"))
    async with serve(create_app({toy.gym_id: toy})) as url:
        async with httpx.AsyncClient(timeout=60) as client:
            answer = await client.post(f"{url}/api/v1/toy/tasks/4", json={})
    assert answer.status_code == 404
    assert "task number 4 is ambiguous: other, task-004" in answer.json()["detail"]
    assert toy.started == []


async def test_the_predecessors_client_starts_the_task_a_number_names(
    serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cua_rl.core.genv_execution.start_genv_execution`` (babelcloud/AReaL, vendored
    unchanged) picks the task id from our task list by the hint's number; without the number
    in the task JSON it fell back to the first task (``sim-001``)."""
    monkeypatch.syspath_prepend(str(VENDORED))
    from cua_rl.core.genv_execution import start_genv_execution, terminate_execution

    sim = SimGym(seed=0)
    async with serve(create_app({sim.gym_id: sim})) as url:
        for hint, expected in (("7", "sim-007"), ("012", "sim-012"), ("sim-003", "sim-003")):
            env = SimpleNamespace(task=SimpleNamespace(id=hint))
            started = await start_genv_execution(env=env, gym_base_url=url, gym_id="sim")
            assert started.task_identifier == expected
            assert started.task_number == expected[-3:]
            live = sim._live[started.execution_id]
            assert live.task.task_id == expected
            await terminate_execution(base_url=url, gym_id="sim", execution_id=started.execution_id)
    assert sim.live_executions == 0
