"""The HTTP client against the real server over loopback, with and without injected faults."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from cua_native.actions.models import Click, ToolCall, TypeText
from cua_native.gym.faults import CreateHang, FaultProfile, Latency
from cua_native.gym.http import (
    ExecutionNotFound,
    GymHTTPError,
    GymProtocolError,
    GymTimeout,
    GymTimeouts,
    GymUnavailable,
    HttpExecution,
    HttpGym,
    RetryPolicy,
    TaskNotFound,
)
from cua_native.gym.protocol import Execution, ExecutionGone, Gym, Task
from cua_native.gym.server import create_app
from cua_native.gym.wire import png_size

FAST_RETRY = RetryPolicy(attempts=4, backoff_s=0.01, backoff_max_s=0.05)
GENEROUS = GymTimeouts(
    connect=30.0, read=60.0, create=60.0, act=60.0, evaluate=60.0, terminate=60.0
)
"""For tests where no timeout is meant to fire: limits a loaded machine never reaches."""


def _assert_no_leak(app: Any, gym: Any) -> None:
    state = app.state.gym_server
    assert not state.live and not state.creations
    assert set(gym.started) == {eid for _, eid in state.created}
    assert all(gym.close_calls[eid] == 1 for eid in gym.started), gym.close_calls
    assert all(count == 1 for count in state.closed.values())


async def test_full_episode_over_http(toy, serve) -> None:
    app = create_app({"toy": toy})
    async with serve(app) as url:
        gym = HttpGym(url, "toy", retries=FAST_RETRY, timeouts=GENEROUS)
        assert isinstance(gym, Gym)
        try:
            tasks = await gym.list_tasks()
            assert [t.task_id for t in tasks][:2] == ["task-001", "task-002"]
            task = await gym.get_task("task-003")
            assert task.instruction == "Click 3 times" and task.model_extra["target"] == 3
            execution = await gym.start(task)
            assert isinstance(execution, Execution)
            assert execution.device == {"width": toy.width, "height": toy.height}
            obs = await execution.observe()
            assert obs.screenshot.png is not None and png_size(obs.screenshot.png) == (
                toy.width,
                toy.height,
            )
            assert (obs.width, obs.height, obs.turn) == (toy.width, toy.height, 0)
            for _ in range(2):
                result = await execution.act(Click(x=0.5, y=0.5))
                assert result.ok and result.observation is not None
            partial = await execution.evaluate()
            assert partial.reward == pytest.approx(2 / 3) and not partial.success
            await execution.act(Click(x=0.1, y=0.9))
            final = await execution.evaluate("done")
            assert final.reward == 1.0 and final.success
            assert final.validators[0].passed and final.validators[0].message == "3 clicks"
            await execution.close()
            await execution.close()
            with pytest.raises(ExecutionGone):
                await execution.observe()
        finally:
            await gym.aclose()
        state = app.state.gym_server
        assert state.terminate_requests[("toy", execution.execution_id)] == 1
        _assert_no_leak(app, toy)


async def test_bad_action_is_a_clear_4xx_and_the_execution_continues(toy, serve) -> None:
    app = create_app({"toy": toy})
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as raw:
        gym = HttpGym(url, "toy", client=raw, retries=FAST_RETRY, timeouts=GENEROUS)
        execution = await gym.start(await gym.get_task("task-002"))
        try:
            path = f"/api/v1/toy/executions/{execution.execution_id}/actions"
            bad = await raw.post(path, json={"action": {"type": "click", "x": 2.0, "y": 0.5}})
            assert bad.status_code == 422 and "action.click.x" in bad.json()["detail"]
            missing = await raw.post(path, json={"act": {}})
            assert missing.status_code == 422 and "'action'" in missing.json()["detail"]
            no_type = await raw.post(path, json={"action": {"x": 0.5}})
            assert no_type.status_code == 422 and "action.type" in no_type.json()["detail"]
            not_json = await raw.post(
                path, content=b"{nope", headers={"content-type": "application/json"}
            )
            assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["detail"]
            refused = await execution.act(ToolCall(name="calculator"))
            assert not refused.ok and "calculator" in (refused.error or "")
            assert (await execution.act(TypeText(text="héllo wörld"))).ok
            assert (await execution.act(Click(x=0.2, y=0.2))).ok
            assert (await execution.evaluate()).reward == 0.5
        finally:
            await execution.close()
            await gym.aclose()
        assert toy.close_calls[execution.execution_id] == 1


async def test_unknown_things_are_404_and_terminate_is_idempotent(toy, serve) -> None:
    app = create_app({"toy": toy})
    async with serve(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as raw:
        gym = HttpGym(url, "toy", retries=FAST_RETRY, timeouts=GENEROUS)
        try:
            with pytest.raises(TaskNotFound) as err:
                await gym.get_task("task-999")
            assert err.value.status == 404 and "task-999" in err.value.detail
            with pytest.raises(TaskNotFound):
                await gym.start(_task("task-999"))
            other = HttpGym(url, "nope", retries=FAST_RETRY, timeouts=GENEROUS)
            with pytest.raises(GymHTTPError) as err:
                await other.list_tasks()
            assert err.value.status == 404 and "unknown gym" in err.value.detail
            await other.aclose()
            missing = await raw.get("/api/v1/toy/executions/ex-77/observation")
            assert missing.status_code == 404 and "ex-77" in missing.json()["detail"]
            execution = await gym.start(_task("task-001"))
            terminate = f"/api/v1/toy/executions/{execution.execution_id}/terminate"
            assert (await raw.post(terminate)).status_code == 200
            again = await raw.post(terminate)
            assert again.status_code == 200 and again.json()["already"] is True
            gone = await raw.get(f"/api/v1/toy/executions/{execution.execution_id}/observation")
            assert gone.status_code == 404 and "terminated" in gone.json()["detail"]
            with pytest.raises(ExecutionNotFound):
                await execution.evaluate()
            await execution.close()
            assert execution.terminated is True
            assert (await raw.post("/api/v1/toy/executions/ex-77/terminate")).status_code == 404
        finally:
            await gym.aclose()
        assert toy.close_calls[execution.execution_id] == 1


def _task(task_id: str) -> Task:
    return Task(task_id=task_id)


async def test_5xx_on_reads_and_evaluate_are_retried(toy, serve) -> None:
    faults = FaultProfile(
        seed=3,
        error_share={"list_tasks": 0.5, "observation": 0.5, "evaluate": 0.5, "get_task": 0.5},
    )
    app = create_app({"toy": toy}, faults)
    retries = RetryPolicy(attempts=12, backoff_s=0.001, backoff_max_s=0.005)
    async with serve(app) as url:
        gym = HttpGym(url, "toy", retries=retries, timeouts=GENEROUS)
        try:
            for _ in range(4):
                assert len(await gym.list_tasks()) == 5
                await gym.get_task("task-001")
            execution = await gym.start(_task("task-001"))
            try:
                for _ in range(8):
                    assert (await execution.observe()).width == toy.width
                    assert (await execution.evaluate()).reward == 0.0
            finally:
                await execution.close()
        finally:
            await gym.aclose()
        _assert_no_leak(app, toy)
        # a gym that fails every read: the client gives up with the status, after its attempts
    always = create_app({"toy": type(toy)()}, FaultProfile(error_share={"list_tasks": 1.0}))
    async with serve(always) as url:
        gym = HttpGym(url, "toy", retries=FAST_RETRY, timeouts=GENEROUS)
        with pytest.raises(GymHTTPError) as err:
            await gym.list_tasks()
        assert err.value.status == 503 and "injected" in err.value.detail
        await gym.aclose()


async def test_dropped_connections_are_typed_errors_and_close_still_terminates(toy, serve) -> None:
    faults = FaultProfile(seed=1, drop_share={"actions": 1.0, "observation": 1.0})
    app = create_app({"toy": toy}, faults)
    async with serve(app) as url:
        gym = HttpGym(url, "toy", retries=FAST_RETRY, timeouts=GENEROUS)
        execution = await gym.start(_task("task-002"))
        try:
            with pytest.raises(GymUnavailable, match="mid-request"):
                await execution.act(Click(x=0.5, y=0.5))
            with pytest.raises(GymUnavailable):
                await execution.observe()
            assert (await execution.evaluate()).reward == 0.0
        finally:
            await execution.close()
            await gym.aclose()
        _assert_no_leak(app, toy)
        state = app.state.gym_server
        assert state.terminate_requests[("toy", execution.execution_id)] == 1


async def _until(condition: Any, what: str, limit_s: float = 60.0) -> None:
    """Bounded polling for a server-side condition (generous limit; no timing assumption)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not condition():
        assert loop.time() < deadline, f"{what}: not within {limit_s} s"
        await asyncio.sleep(0.01)


async def test_create_that_times_out_is_retried_onto_the_same_execution(toy, serve) -> None:
    # the creation finishes only once the server has seen the retry: the first attempt surely
    # timed out and the retry surely waits on the same creation, however loaded the machine
    toy.start_gate = asyncio.Event()
    app = create_app({"toy": toy})
    timeouts = GymTimeouts(connect=5.0, create=2.0, read=5.0)
    retries = RetryPolicy(attempts=3, backoff_s=0.01)
    async with serve(app) as url:
        gym = HttpGym(url, "toy", retries=retries, timeouts=timeouts, idempotent_create=True)
        try:
            starting = asyncio.create_task(gym.start(_task("task-001")))
            await _until(lambda: _create_requests(app) >= 2, "the retry reached the server")
            toy.start_gate.set()
            execution = await starting
            await execution.close()
        finally:
            await gym.aclose()
        assert toy.start_calls == 1 and toy.started == [execution.execution_id]
        _assert_no_leak(app, toy)


def _create_requests(app: Any) -> int:
    return sum(pending.requests for pending in app.state.gym_server.by_request.values())


async def test_create_hanging_past_every_attempt_leaves_no_orphan(toy, serve) -> None:
    # the creation is released only after the client gave up: every attempt's deadline has
    # passed on the server by then (a deadline runs from when the server got the request)
    toy.start_gate = asyncio.Event()
    app = create_app({"toy": toy})
    state = app.state.gym_server
    timeouts = GymTimeouts(connect=5.0, create=0.2, read=5.0)
    retries = RetryPolicy(attempts=2, backoff_s=0.01)
    async with serve(app) as url:
        gym = HttpGym(url, "toy", retries=retries, timeouts=timeouts, idempotent_create=True)
        try:
            with pytest.raises(GymTimeout):
                await gym.start(_task("task-001"))
            toy.start_gate.set()
            await asyncio.wait_for(state.settle(), 60)
            assert len(state.reaped) == 1 and len(toy.started) == 1
            assert await gym.held_executions() == 0
        finally:
            await gym.aclose()
        _assert_no_leak(app, toy)


async def _cancel_a_create(url: str, toy: Any) -> HttpGym:
    """A client whose create reached the gym (held at ``toy.start_gate``) and was cancelled."""
    toy.start_gate = asyncio.Event()
    gym = HttpGym(url, "toy", retries=FAST_RETRY, timeouts=GENEROUS, idempotent_create=True)
    starting = asyncio.create_task(gym.start(_task("task-001")))
    await _until(lambda: toy.start_calls == 1, "create reached the gym")
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    return gym


async def test_cancelled_create_is_reclaimed_in_the_background(toy, serve) -> None:
    app = create_app({"toy": toy})
    async with serve(app) as url:
        gym = await _cancel_a_create(url, toy)
        toy.start_gate.set()
        await gym.aclose()
        await asyncio.wait_for(app.state.gym_server.settle(), 60)
        assert len(toy.started) == 1
        _assert_no_leak(app, toy)


async def test_a_closing_client_releases_what_an_abandoned_create_left(
    toy, serve, monkeypatch
) -> None:
    # the cancelled create's background reclaim is cut short (the close waits for nothing in
    # the background): the close's own sweep finds the creation by its request id, waits for
    # it to finish and terminates it; without the sweep the execution stays live
    monkeypatch.setattr("cua_native.gym.http.BACKGROUND_WAIT_S", 0.0)
    app = create_app({"toy": toy})
    async with serve(app) as url:
        gym = await _cancel_a_create(url, toy)
        closing = asyncio.create_task(gym.aclose())
        toy.start_gate.set()
        await asyncio.wait_for(closing, 60)
        assert gym.held_at_close == 0
        await asyncio.wait_for(app.state.gym_server.settle(), 60)
        assert len(toy.started) == 1
        _assert_no_leak(app, toy)


async def test_many_episodes_under_random_faults_terminate_everything_exactly_once(
    toy, serve
) -> None:
    faults = FaultProfile(
        seed=7,
        latency=Latency(fixed_s=0.0, jitter_s=0.01),
        error_share={"*": 0.15},
        drop_share={"observation": 0.1, "actions": 0.1, "terminate": 0.2, "evaluate": 0.1},
        create_hang=CreateHang(seconds=0.5, share=0.3),
    )
    app = create_app({"toy": toy}, faults)
    timeouts = GymTimeouts(connect=2.0, create=0.3, read=2.0, act=2.0, evaluate=2.0, terminate=2.0)
    retries = RetryPolicy(attempts=5, backoff_s=0.01, backoff_max_s=0.05)
    outcomes: list[str] = []

    async def episode(gym: HttpGym, index: int) -> None:
        execution = None
        try:
            execution = await gym.start(_task(f"task-00{1 + index % 5}"))
            for _ in range(3):
                await execution.observe()
                await execution.act(Click(x=0.3, y=0.3))
            await execution.evaluate()
            outcomes.append("ok")
        except Exception as exc:
            assert isinstance(exc, GymUnavailable | GymHTTPError | GymTimeout | ExecutionGone), exc
            outcomes.append(type(exc).__name__)
        finally:
            if execution is not None:
                await execution.close()

    async with serve(app) as url:
        gym = HttpGym(url, "toy", retries=retries, timeouts=timeouts, idempotent_create=True)
        try:
            await asyncio.gather(*(episode(gym, i) for i in range(12)))
        finally:
            await gym.aclose()
        state = app.state.gym_server
        await asyncio.wait_for(state.settle(), 60)  # creations reaped after their deadline
        assert len(outcomes) == 12 and "ok" in outcomes
        _assert_no_leak(app, toy)


async def test_server_shutdown_closes_live_executions(toy, serve) -> None:
    app = create_app({"toy": toy})
    async with serve(app) as url:
        gym = HttpGym(url, "toy", retries=FAST_RETRY, timeouts=GENEROUS)
        first = await gym.start(_task("task-001"))
        second = await gym.start(_task("task-002"))
        await gym.aclose()
    assert toy.close_calls == {first.execution_id: 1, second.execution_id: 1}
    assert not app.state.gym_server.live


async def test_config_mappings_and_custom_step_routes(toy, serve) -> None:
    app = create_app({"toy": toy})
    async with serve(app) as url:
        gym = HttpGym(
            url,
            "toy",
            timeouts={"read": 3.0, "create": 4.0},
            retries={"attempts": 2, "backoff_s": 0.01, "retry_statuses": [503]},
            routes={"observation": "/api/v1/{gym_id}/executions/{execution_id}/nowhere"},
        )
        assert gym.timeouts.create == 4.0 and gym.retries.retry_statuses == frozenset({503})
        execution = await gym.start(_task("task-001"))
        try:
            with pytest.raises(GymHTTPError) as err:
                await execution.observe()
            assert err.value.status == 404 and err.value.route == "observation"
            assert (await execution.act(Click(x=0.5, y=0.5))).ok
        finally:
            await execution.close()
            await gym.aclose()
        _assert_no_leak(app, toy)


async def test_failed_creation_is_a_502_and_an_idempotent_retry_starts_afresh(toy, serve) -> None:
    toy.fail_starts = 1
    app = create_app({"toy": toy})
    async with serve(app) as url:
        once = HttpGym(url, "toy", retries=FAST_RETRY, timeouts=GENEROUS, idempotent_create=False)
        toy_task = _task("task-002")
        with pytest.raises(GymHTTPError) as err:
            await once.start(toy_task)
        assert err.value.status == 502 and "device pool exhausted" in err.value.detail
        toy.fail_starts = 1
        retrying = HttpGym(
            url, "toy", retries=FAST_RETRY, timeouts=GENEROUS, idempotent_create=True
        )
        execution = await retrying.start(toy_task)
        await execution.close()
        await once.aclose()
        await retrying.aclose()
        assert toy.started == [execution.execution_id]
        _assert_no_leak(app, toy)


async def test_url_screenshots_honour_the_allow_list(toy, serve) -> None:
    toy.screenshot_url = "https://shots.example.com/run"
    app = create_app({"toy": toy})
    async with serve(app) as url:
        allowed = HttpGym(url, "toy", allowed_media_domains=["shots.example.com"])
        refused = HttpGym(url, "toy")
        execution = await allowed.start(_task("task-001"))
        try:
            obs = await execution.observe()
            assert (
                obs.screenshot.url
                == f"https://shots.example.com/run/{execution.execution_id}/0.png"
            )
            other = HttpExecution(refused, execution.execution_id, execution.task)
            with pytest.raises(GymProtocolError, match="not in the allowed media domains"):
                await other.observe()
        finally:
            await execution.close()
            await allowed.aclose()
            await refused.aclose()
        _assert_no_leak(app, toy)


async def test_unreachable_gym_is_gym_unavailable() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gym = HttpGym(f"http://127.0.0.1:{port}", "toy", retries=FAST_RETRY, timeouts=GENEROUS)
    with pytest.raises(GymUnavailable, match="cannot reach gym"):
        await gym.list_tasks()
    with pytest.raises(GymUnavailable, match="cannot reach gym"):
        await gym.start(_task("task-001"))
    execution = HttpExecution(gym, "ex-1", _task("task-001"))
    await execution.close()  # never raises; records that the gym did not confirm
    assert execution.terminated is False
    await gym.aclose()
    await gym.aclose()
