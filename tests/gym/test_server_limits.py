"""The gym server under abuse: max-live, idle TTL (fake clock), body cap, bearer auth, and the
client's capability detection and leak count, against the real server over loopback."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from cua_native.gym.http import GymHTTPError, GymTimeouts, HttpGym, RetryPolicy
from cua_native.gym.protocol import Task
from cua_native.gym.server import create_app
from cua_native.gym.server_guards import ServerLimits

RETRY = RetryPolicy(attempts=2, backoff_s=0.01)
GENEROUS = GymTimeouts(
    connect=30.0, read=60.0, create=60.0, act=60.0, evaluate=60.0, terminate=60.0
)
"""No timeout is under test here: limits a loaded machine never reaches."""


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _task(task_id: str = "task-001") -> Task:
    return Task(task_id=task_id)


async def test_max_live_is_a_429_with_a_clear_detail(toy, serve) -> None:
    app = create_app({"toy": toy}, limits=ServerLimits(max_live=2))
    async with serve(app) as url:
        gym = HttpGym(url, "toy", retries=RETRY, timeouts=GENEROUS)
        try:
            first = await gym.start(_task())
            await gym.start(_task())
            with pytest.raises(GymHTTPError) as err:
                await gym.start(_task())
            assert err.value.status == 429
            assert "max_live is 2" in err.value.detail
            await first.close()
            third = await gym.start(_task())  # room again once one is terminated
            await third.close()
        finally:
            await gym.aclose()
    assert len(toy.started) == 3


async def test_idle_executions_are_reaped_on_a_fake_clock(toy, serve) -> None:
    clock = FakeClock()
    limits = ServerLimits(idle_ttl_s=10.0, reap_interval_s=3600.0)
    app = create_app({"toy": toy}, limits=limits, clock=clock)
    state = app.state.gym_server
    async with serve(app) as url:
        gym = HttpGym(url, "toy", retries=RETRY, timeouts=GENEROUS)
        try:
            abandoned = await gym.start(_task())  # its client "dies": never closed
            used = await gym.start(_task())
            clock.now += 6
            await used.observe()
            clock.now += 6  # abandoned idle 12 s, used idle 6 s
            assert await state.reap_idle() == [("toy", abandoned.execution_id)]
            assert toy.close_calls[abandoned.execution_id] == 1
            with pytest.raises(GymHTTPError) as err:
                await abandoned.observe()
            assert err.value.status == 404 and "terminated" in err.value.detail
            await used.observe()
            assert await gym.held_executions() == 1
            await used.close()
            await abandoned.close()  # already gone: a confirmed no-op
            assert await gym.held_executions() == 0
        finally:
            await gym.aclose()
    assert all(count == 1 for count in toy.close_calls.values())


async def test_body_over_the_cap_is_a_413_by_header_or_stream(toy, serve) -> None:
    app = create_app({"toy": toy}, limits=ServerLimits(max_body_bytes=4096))
    async with serve(app) as url:
        gym = HttpGym(url, "toy", retries=RETRY, timeouts=GENEROUS)
        execution = await gym.start(_task())
        path = f"{url}/api/v1/toy/executions/{execution.execution_id}/actions"
        big = b'{"action": {"type": "type", "text": "' + b"x" * 8000 + b'"}}'

        async def chunks() -> Any:
            for start in range(0, len(big), 1000):
                yield big[start : start + 1000]

        async with httpx.AsyncClient(timeout=60) as client:
            declared = await client.post(path, content=big)
            streamed = await client.post(path, content=chunks())
            small = await client.post(path, json={"action": {"type": "type", "text": "ok"}})
        for answer in (declared, streamed):
            assert answer.status_code == 413
            assert "larger than 4096 bytes" in answer.json()["detail"]
        assert small.status_code == 200
        await execution.close()
        await gym.aclose()


async def test_bearer_auth_guards_every_route(toy, serve, monkeypatch) -> None:
    app = create_app({"toy": toy}, limits=ServerLimits(auth_token="s3cret"))
    monkeypatch.setenv("TEST_GYM_TOKEN", "s3cret")
    async with serve(app) as url:
        anonymous = HttpGym(url, "toy", retries=RETRY, timeouts=GENEROUS)
        wrong = HttpGym(url, "toy", retries=RETRY, timeouts=GENEROUS, auth_token="guess")
        right = HttpGym(
            url, "toy", retries=RETRY, timeouts=GENEROUS, auth_token_env="TEST_GYM_TOKEN"
        )
        try:
            for client in (anonymous, wrong):
                with pytest.raises(GymHTTPError) as err:
                    await client.list_tasks()
                assert err.value.status == 401 and "bearer token" in err.value.detail
            assert len(await right.list_tasks()) == 5
            execution = await right.start(_task())
            assert right.idempotent_create is True
            await execution.close()
        finally:
            for client in (anonymous, wrong, right):
                await client.aclose()
    monkeypatch.delenv("TEST_GYM_TOKEN")
    with pytest.raises(ValueError, match="TEST_GYM_TOKEN is unset"):
        HttpGym("http://127.0.0.1:9", "toy", auth_token_env="TEST_GYM_TOKEN")


def _genv_like(toy: Any) -> FastAPI:
    """genv's create route only: no capabilities, no listing, options passed through."""
    app = FastAPI()
    seen: list[dict[str, Any]] = []
    app.state.seen = seen

    @app.post("/api/v1/{gym_id}/tasks/{task_id}")
    async def create(gym_id: str, task_id: str, body: dict[str, Any]) -> dict[str, Any]:
        seen.append(body)
        return {"execution_id": f"genv-{len(seen)}", "device": {"device_serial": "emulator-1"}}

    @app.post("/api/v1/{gym_id}/executions/{execution_id}/terminate")
    async def terminate(gym_id: str, execution_id: str) -> dict[str, Any]:
        return {}

    return app


async def test_idempotent_create_auto_follows_the_servers_capabilities(toy, serve) -> None:
    async with serve(create_app({"toy": toy})) as url:
        ours = HttpGym(url, "toy", retries=RETRY, timeouts=GENEROUS)
        assert ours.idempotent_create == "auto"
        execution = await ours.start(_task())
        assert ours.idempotent_create is True
        await execution.close()
        await ours.aclose()
    genv = _genv_like(toy)
    async with serve(genv) as url:
        theirs = HttpGym(url, "toy", retries=RETRY, timeouts=GENEROUS)
        execution = await theirs.start(_task())
        assert theirs.idempotent_create is False
        assert genv.state.seen == [{"options": {}}]  # no request id sent to genv
        assert await theirs.held_executions() is None  # genv cannot say what it holds
        await execution.close()
        await theirs.aclose()


async def test_held_executions_counts_only_this_clients_creates(toy, serve) -> None:
    async with serve(create_app({"toy": toy})) as url:
        mine = HttpGym(url, "toy", retries=RETRY, timeouts=GENEROUS)
        other = HttpGym(url, "toy", retries=RETRY, timeouts=GENEROUS)
        try:
            kept = await mine.start(_task())
            theirs = await other.start(_task())
            assert await mine.held_executions() == 1
            await kept.close()
            assert await mine.held_executions() == 0
            assert await other.held_executions() == 1
            await theirs.close()
        finally:
            await mine.aclose()
            await other.aclose()


def test_limits_refuse_nonsense() -> None:
    for bad in ({"max_live": 0}, {"idle_ttl_s": -1.0}, {"max_body_bytes": 10}, {"auth_token": " "}):
        with pytest.raises(ValueError):
            ServerLimits(**bad)


async def test_evaluate_counts_what_the_server_still_holds(toy, serve) -> None:
    """``leaked_executions`` is the server's own count when it can list its executions: an
    execution created behind the counting layer's back (like the orphan of a timed-out create)
    is a leak even though every execution the counter saw was closed."""
    from cua_native.evaluate import CountingGym

    async with serve(create_app({"toy": toy})) as url:
        counting = CountingGym(HttpGym(url, "toy", retries=RETRY, timeouts=GENEROUS))
        seen = await counting.start(_task())
        await seen.close()
        orphan = await counting.inner.start(_task())
        assert counting.started == counting.closed == 1
        await counting.aclose()
        assert counting.leaked == 1  # released by the client's close, still counted
        assert counting.inner.held_at_close == 0 and counting.inner.released_at_close == 1
    assert toy.close_calls[orphan.execution_id] == 1  # the client's close released it
