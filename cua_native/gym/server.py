"""Serve any ``Gym`` over the HTTP routes of ``docs/gym_protocol.md`` (FastAPI + uvicorn).

    python -m cua_native.gym.server --host 127.0.0.1 --port 5010 [--gym sim] [--seed N]
        [--fault-profile FILE|JSON] [--max-live N] [--idle-ttl-s S] [--max-body-bytes B]
        [--auth-token-env VAR]

Limits (``ServerLimits``, ``docs/gym_protocol.md``): at most ``max_live`` executions live or
being created (429 beyond), executions idle for ``idle_ttl_s`` are closed by a reaper, request
bodies over ``max_body_bytes`` are refused (413), and with a token every route needs
``Authorization: Bearer <token>`` (401). ``GET /api/v1/{gym}/capabilities`` says what this server
supports beyond genv (idempotent creates, the execution listing) and its limits;
``GET /api/v1/{gym}/executions`` lists what it holds, so a client can count its leaks.
``POST /api/v1/{gym}/executions/{id}/fork`` copies an execution's state into a new execution
(the gym's executions must implement ``ForkableExecution``; 501 where they cannot, and the
capabilities' ``fork`` says which).

Idempotent actions (beyond genv's protocol): an action sent with ``Idempotency-Key: K`` runs
once per execution; the same key again gets the stored answer (the same action) or 409 (another
action), so a client may retry an action whose answer it lost. Capabilities say
``idempotent_actions`` and ``replays_exactly`` (the gym's ``ReplayableGym`` answer).

Orphan-free creation (beyond genv's protocol, ignored by genv): a create may carry
``options.client_request_id`` and ``options.client_deadline_s``.
- A create with a request id already seen returns the SAME execution (waiting for it when its
  creation is still running) instead of starting a second one, so a client may retry a create that
  timed out.
- The deadline says how long the client waits for this answer. When a creation finishes after the
  latest deadline of its request (minus a margin for the answer to travel), nobody is waiting any
  more: the server closes the execution itself and answers 504, so a hung create leaves no orphan.
Both keys are removed from the options before ``Gym.start`` sees them.

Tasks are served with their number (``task_number`` and ``meta.number``), and a task named by
a number that is no task id (``/tasks/7``) is the one task of that number
(``gym/task_numbers.py``): an unknown or ambiguous name is a 404, never another task.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cua_native.actions.models import action_from_json
from cua_native.gym.faults import FaultInjector, FaultProfile, FaultProfileError, Route
from cua_native.gym.protocol import (
    Execution,
    ExecutionGone,
    ForkUnsupported,
    Gym,
    GymError,
    Task,
    fork_execution,
    gym_replays_exactly,
)
from cua_native.gym.server_guards import (
    DEFAULT_IDLE_TTL_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_LIVE,
    BearerAuth,
    BodyLimit,
    ServerLimits,
)
from cua_native.gym.task_numbers import by_number, numbered_json
from cua_native.gym.wire import (
    evaluation_to_json,
    observation_to_json,
    step_result_to_json,
)

log = logging.getLogger(__name__)

DEADLINE_MARGIN_MAX_S = 1.0
DEADLINE_MARGIN_SHARE = 0.1
SHUTDOWN_CREATE_WAIT_S = 30.0


class CreateExpired(Exception):
    """A creation finished after every client waiting for it had given up."""


@dataclass
class _Live:
    execution: Execution
    request_key: tuple[str, str] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = 0.0
    """Clock time of the last call that touched it (the idle reaper's measure)."""
    busy: int = 0
    """Calls running on it now: a busy execution is never idle."""
    acts: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    """Idempotency key → (the action's JSON, the answer): a repeated key is answered from
    here, and the action does not run twice."""
    acted: int = 0
    """Actions the execution actually ran (not answers repeated from ``acts``)."""


@dataclass
class _PendingCreate:
    task_id: str
    task: asyncio.Task[str] | None = None
    deadline: float | None = None
    """Loop time after which no client waits for the answer; ``None``: someone waits forever."""
    unbounded: bool = False
    started_at: float = 0.0
    """Clock time the creation began (the reaper forgets expired request ids after the TTL)."""
    requests: int = 0
    """Create requests that joined this creation (the first and its retries)."""

    def extend(self, now: float, deadline_s: float | None) -> None:
        if deadline_s is None:
            self.unbounded = True
            return
        margin = min(DEADLINE_MARGIN_MAX_S, DEADLINE_MARGIN_SHARE * deadline_s)
        candidate = now + deadline_s - margin
        self.deadline = candidate if self.deadline is None else max(self.deadline, candidate)

    def expired(self, now: float) -> bool:
        return not self.unbounded and self.deadline is not None and now > self.deadline


@dataclass
class GymServerState:
    """Live executions and counters (``created``/``closed`` let tests prove nothing leaks).

    ``clock`` (monotonic seconds) measures idleness; tests pass a fake one and call
    ``reap_idle`` themselves.
    """

    gyms: Mapping[str, Gym]
    injector: FaultInjector | None = None
    limits: ServerLimits = field(default_factory=ServerLimits)
    clock: Callable[[], float] = time.monotonic
    live: dict[tuple[str, str], _Live] = field(default_factory=dict)
    gone: set[tuple[str, str]] = field(default_factory=set)
    by_request: dict[tuple[str, str], _PendingCreate] = field(default_factory=dict)
    creations: set[asyncio.Task[str]] = field(default_factory=set)
    created: list[tuple[str, str]] = field(default_factory=list)
    closed: Counter[tuple[str, str]] = field(default_factory=Counter)
    reaped: list[tuple[str, str]] = field(default_factory=list)
    crashed: list[tuple[str, str]] = field(default_factory=list)
    """Creations closed by the server because they finished after every client's deadline."""
    expired: list[tuple[str, str]] = field(default_factory=list)
    """Executions closed by the idle reaper."""
    terminate_requests: Counter[tuple[str, str]] = field(default_factory=Counter)

    def gym(self, gym_id: str) -> Gym:
        gym = self.gyms.get(gym_id)
        if gym is None:
            raise HTTPException(404, f"unknown gym {gym_id!r}; known: {sorted(self.gyms)}")
        return gym

    def execution(self, gym_id: str, execution_id: str) -> _Live:
        self.gym(gym_id)
        live = self.live.get((gym_id, execution_id))
        if live is None:
            state = "terminated" if (gym_id, execution_id) in self.gone else "unknown"
            raise HTTPException(404, f"{state} execution {execution_id!r} in gym {gym_id!r}")
        return live

    def held(self) -> int:
        """Executions live or being created: what ``max_live`` caps."""
        return len(self.live) + len(self.creations)

    @contextlib.asynccontextmanager
    async def using(self, live: _Live) -> AsyncIterator[None]:
        """Serialise calls on one execution and keep its idle clock current."""
        live.busy += 1
        live.last_used = self.clock()
        try:
            async with live.lock:
                yield
        finally:
            live.busy -= 1
            live.last_used = self.clock()

    async def crash(self, gym_id: str, execution_id: str) -> bool:
        """An injected crash: the execution dies (closed, forgotten; later requests get 404).
        Returns whether it was live."""
        key = (gym_id, execution_id)
        live = self.live.pop(key, None)
        if live is None:
            return False
        if live.request_key is not None:
            self.by_request.pop(live.request_key, None)
        self.crashed.append(key)
        await self.close_execution(key, live.execution)
        return True

    async def reap_idle(self) -> list[tuple[str, str]]:
        """Close executions idle for longer than ``limits.idle_ttl_s``; forget request ids of
        creations that expired as long ago. Returns the keys closed."""
        ttl = self.limits.idle_ttl_s
        if ttl is None:
            return []
        now = self.clock()
        idle = [
            key for key, live in self.live.items() if not live.busy and now - live.last_used > ttl
        ]
        for key in idle:
            live = self.live.pop(key, None)
            if live is None:  # closed meanwhile (a terminate, a concurrent pass)
                continue
            if live.request_key is not None:
                self.by_request.pop(live.request_key, None)
            log.info("closing execution %s: idle for more than %.0f s", key, ttl)
            self.expired.append(key)
            await self.close_execution(key, live.execution)
        for request_key, pending in list(self.by_request.items()):
            finished = pending.task is not None and pending.task.done()
            if finished and now - pending.started_at > ttl:
                del self.by_request[request_key]
        return idle

    async def reap_forever(self) -> None:
        """The idle reaper: ``reap_idle`` every ``limits.reap_every_s`` seconds."""
        interval = self.limits.reap_every_s
        if interval is None:
            return
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reap_idle()
            except Exception:
                log.exception("idle reaper pass failed")

    async def settle(self) -> None:
        """Wait until every running creation has finished (registered, reaped or failed)."""
        while self.creations:
            await asyncio.gather(*list(self.creations), return_exceptions=True)

    def listing(self, gym_id: str) -> dict[str, Any]:
        """What ``GET /api/v1/{gym}/executions`` answers."""
        now = self.clock()
        loop_now = asyncio.get_running_loop().time()
        executions = [
            {
                "execution_id": execution_id,
                "task_id": live.execution.task.task_id,
                "client_request_id": live.request_key[1] if live.request_key else None,
                "idle_s": round(max(0.0, now - live.last_used), 3),
            }
            for (gid, execution_id), live in self.live.items()
            if gid == gym_id
        ]
        creating = [
            {
                "client_request_id": request_id,
                "task_id": pending.task_id,
                "expired": pending.expired(loop_now),
            }
            for (gid, request_id), pending in self.by_request.items()
            if gid == gym_id and pending.task is not None and not pending.task.done()
        ]
        return {"executions": executions, "creating": creating}

    async def close_execution(self, key: tuple[str, str], execution: Execution) -> None:
        self.gone.add(key)
        self.closed[key] += 1
        try:
            await execution.close()
        except Exception:
            log.exception("closing execution %s failed", key)

    async def shutdown(self) -> None:
        """Let running creations finish (they register or reap), then close everything live."""
        if self.creations:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SHUTDOWN_CREATE_WAIT_S):
                    await asyncio.gather(*self.creations, return_exceptions=True)
        for task in list(self.creations):
            task.cancel()
        while self.live:
            key, live = self.live.popitem()
            await self.close_execution(key, live.execution)


def _route_of(method: str, path: str) -> Route | None:
    parts = path.strip("/").split("/")
    if len(parts) < 4 or parts[:2] != ["api", "v1"]:
        return None
    rest = parts[3:]
    if rest == ["tasks"] and method == "GET":
        return "list_tasks"
    if len(rest) == 2 and rest[0] == "tasks":
        return "get_task" if method == "GET" else "create" if method == "POST" else None
    if len(rest) == 3 and rest[0] == "executions":
        route = {"observation": "observation", "actions": "actions", "evaluate": "evaluate"}
        route["terminate"] = "terminate"
        return route.get(rest[2])  # type: ignore[return-value]
    return None


class FaultMiddleware:
    """ASGI middleware applying a ``FaultInjector`` before the routes run.

    A drop sends the status line and headers announcing a body, then returns without the body:
    uvicorn then closes the socket, and the client sees a connection cut mid-answer (before the
    route ran; ``drop_after``: once the route ran, its answer lost). A throttle
    answers 429 with ``Retry-After``; a stall waits before the route runs; a crash closes the
    execution through ``crash(gym_id, execution_id)`` and answers 502. Every injected fault is
    logged as one ``fault=KIND route=ROUTE path=PATH`` line (what ``bench/experiments/chaos.py`` counts).
    """

    def __init__(
        self,
        app: ASGIApp,
        injector: FaultInjector,
        crash: Callable[[str, str], Awaitable[bool]] | None = None,
    ) -> None:
        self.app = app
        self.injector = injector
        self.crash = crash

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = _route_of(scope.get("method", ""), scope.get("path", ""))
        if scope["type"] != "http" or route is None:
            await self.app(scope, receive, send)
            return
        decision = self.injector.decide(route)
        crashed = False
        if decision.crash and self.crash is not None:  # only a live execution can crash
            parts = scope["path"].strip("/").split("/")  # api/v1/{gym}/executions/{id}/...
            crashed = await self.crash(parts[2], parts[4])
        kind = "crash" if crashed else decision.kind if decision.kind != "crash" else None
        if kind is not None:
            log.info("fault=%s route=%s path=%s", kind, route, scope["path"])
        if crashed:
            await _answer(send, 502, f"injected fault: the execution crashed on {route}")
            return
        if decision.delay_s > 0:
            await asyncio.sleep(decision.delay_s)
        if decision.stall_s > 0:
            await asyncio.sleep(decision.stall_s)
        if decision.drop:
            headers = [(b"content-type", b"application/json"), (b"content-length", b"64")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            return
        if decision.error:
            status = self.injector.profile.error_status
            await _answer(send, status, f"injected fault: HTTP {status} on {route}")
            return
        if decision.throttle:
            retry_after = str(self.injector.profile.retry_after_s).encode()
            await _answer(
                send, 429, f"injected fault: throttled on {route}", [(b"retry-after", retry_after)]
            )
            return
        if decision.drop_after:
            await self.app(scope, receive, _swallow)
            headers = [(b"content-type", b"application/json"), (b"content-length", b"64")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            return
        await self.app(scope, receive, send)


async def _swallow(message: Message) -> None:
    """A ``send`` that loses the answer (``drop_after``)."""
    return None


async def _answer(
    send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps({"detail": detail}).encode()
    head = [(b"content-type", b"application/json"), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


async def _json_object(request: Request, *, allow_empty: bool) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        if allow_empty:
            return {}
        raise HTTPException(400, "request body must be a JSON object, got an empty body")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise HTTPException(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise HTTPException(400, f"request body must be a JSON object, got {type(body).__name__}")
    return body


def _action_error(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        where = f"action.{loc}" if loc else "action.type"
        problems.append(f"{where}: {err['msg']}")
    return "invalid action: " + "; ".join(problems)


async def _find_task(gym: Gym, task_id: str) -> Task:
    """The task of that id, else the one task numbered so (``"7"`` is ``sim-007``;
    ``task_numbers.by_number``); 404 with one line otherwise, never another task."""
    try:
        return await gym.get_task(task_id)
    except (LookupError, ExecutionGone) as exc:
        missing = exc
    try:
        numbered = by_number(await gym.list_tasks(), task_id)
    except LookupError as exc:
        raise HTTPException(404, f"{exc} in gym {gym.gym_id!r}; name the task id") from exc
    if numbered is None:
        raise HTTPException(404, f"unknown task {task_id!r} in gym {gym.gym_id!r}") from missing
    return await gym.get_task(numbered.task_id)


async def _device_of(execution: Execution) -> dict[str, Any]:
    """Screen size (attributes, else one observation) and serial; never fails the create,
    which would orphan the execution just registered."""
    width, height = getattr(execution, "width", None), getattr(execution, "height", None)
    if not (isinstance(width, int) and isinstance(height, int)):
        try:
            obs = await execution.observe()
            width, height = obs.width, obs.height
        except Exception:
            log.exception("could not read the screen size of %s", execution.execution_id)
            return {}
    device: dict[str, Any] = {"width": width, "height": height}
    serial = getattr(execution, "device_serial", None)
    if isinstance(serial, str):
        device["device_serial"] = serial
    return device


def create_app(
    gyms: Mapping[str, Gym],
    faults: FaultProfile | None = None,
    limits: ServerLimits | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> FastAPI:
    """A FastAPI app serving ``gyms`` (by gym id). State: ``app.state.gym_server``.

    ``limits`` default to ``ServerLimits()`` (no auth); ``clock`` measures idleness."""
    limits = limits or ServerLimits()
    state = GymServerState(
        gyms=dict(gyms),
        injector=FaultInjector(faults) if faults else None,
        limits=limits,
        clock=clock,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.create_task(state.reap_forever())
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await state.shutdown()

    app = FastAPI(title="cua_native gym server", lifespan=lifespan)
    app.state.gym_server = state
    if state.injector is not None:
        app.add_middleware(FaultMiddleware, injector=state.injector, crash=state.crash)
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)
    if limits.auth_token is not None:
        app.add_middleware(BearerAuth, token=limits.auth_token)  # outermost: checked first

    @app.exception_handler(ExecutionGone)
    async def _gone(_: Request, exc: ExecutionGone) -> JSONResponse:
        return JSONResponse({"detail": f"execution gone: {exc}"}, status_code=404)

    @app.exception_handler(GymError)
    async def _gym_failed(_: Request, exc: GymError) -> JSONResponse:
        return JSONResponse({"detail": f"gym error: {exc}"}, status_code=502)

    @app.get("/api/v1/{gym_id}/capabilities")
    async def capabilities(gym_id: str) -> dict[str, Any]:
        state.gym(gym_id)
        return {
            "idempotent_create": True,
            "executions_listing": True,
            "max_live": limits.max_live,
            "idle_ttl_s": limits.idle_ttl_s,
            "max_body_bytes": limits.max_body_bytes,
            "auth": limits.auth_token is not None,
            "fork": bool(getattr(state.gym(gym_id), "can_fork", False)),
            "idempotent_actions": True,
            "replays_exactly": await gym_replays_exactly(state.gym(gym_id)),
        }

    @app.get("/api/v1/{gym_id}/executions")
    async def executions(gym_id: str) -> dict[str, Any]:
        state.gym(gym_id)
        return state.listing(gym_id)

    @app.get("/api/v1/{gym_id}/tasks")
    async def list_tasks(gym_id: str) -> dict[str, Any]:
        tasks = await state.gym(gym_id).list_tasks()
        return {"tasks": [numbered_json(t) for t in tasks]}

    @app.get("/api/v1/{gym_id}/tasks/{task_id}")
    async def get_task(gym_id: str, task_id: str) -> dict[str, Any]:
        return numbered_json(await _find_task(state.gym(gym_id), task_id))

    async def run_creation(
        gym_id: str,
        gym: Gym,
        task: Task,
        options: dict[str, Any],
        pending: _PendingCreate,
        request_id: str | None,
    ) -> str:
        hang = state.injector.create_hang_s() if state.injector else 0.0
        if hang:
            log.info("fault=slow_create route=create path=%s seconds=%.2f", task.task_id, hang)
            await asyncio.sleep(hang)
        execution = await gym.start(task, options)
        key = (gym_id, execution.execution_id)
        state.created.append(key)
        if pending.expired(asyncio.get_running_loop().time()):
            state.reaped.append(key)
            await state.close_execution(key, execution)
            raise CreateExpired(f"execution {execution.execution_id!r} finished after the deadline")
        state.live[key] = _Live(
            execution, (gym_id, request_id) if request_id else None, last_used=state.clock()
        )
        return execution.execution_id

    @app.post("/api/v1/{gym_id}/tasks/{task_id}")
    async def create(gym_id: str, task_id: str, request: Request) -> dict[str, Any]:
        gym = state.gym(gym_id)
        body = await _json_object(request, allow_empty=True)
        options = body.get("options") or {}
        if not isinstance(options, dict):
            raise HTTPException(422, "body field 'options' must be an object")
        options = dict(options)
        request_id = options.pop("client_request_id", None)
        deadline_s = options.pop("client_deadline_s", None)
        if request_id is not None and not isinstance(request_id, str):
            raise HTTPException(422, "options.client_request_id must be a string")
        if deadline_s is not None and not (isinstance(deadline_s, int | float) and deadline_s > 0):
            raise HTTPException(422, "options.client_deadline_s must be a positive number")
        task = await _find_task(gym, task_id)
        now = asyncio.get_running_loop().time()
        pending = state.by_request.get((gym_id, request_id)) if request_id else None
        if pending is not None and pending.task_id != task.task_id:
            raise HTTPException(
                409, f"client_request_id {request_id!r} was used for task {pending.task_id!r}"
            )
        if pending is None:
            if state.held() >= limits.max_live:
                raise HTTPException(
                    429,
                    f"too many live executions: {state.held()} live or being created, the"
                    f" server's max_live is {limits.max_live}; terminate finished executions"
                    " or retry later",
                    headers={"Retry-After": "5"},
                )
            pending = _PendingCreate(task.task_id, started_at=state.clock())
            pending.extend(now, deadline_s)
            creation = asyncio.create_task(
                run_creation(gym_id, gym, task, options, pending, request_id)
            )
            pending.task = creation
            state.creations.add(creation)
            creation.add_done_callback(state.creations.discard)
            if request_id:
                state.by_request[(gym_id, request_id)] = pending
        else:
            pending.extend(now, deadline_s)
        pending.requests += 1
        assert pending.task is not None
        try:
            execution_id = await asyncio.shield(pending.task)
        except CreateExpired as exc:
            raise HTTPException(504, f"creation exceeded the client's deadline: {exc}") from exc
        except Exception:
            # nothing was created: a retry with the same request id starts afresh
            if request_id and state.by_request.get((gym_id, request_id)) is pending:
                del state.by_request[(gym_id, request_id)]
            raise
        key = (gym_id, execution_id)
        if key not in state.live:
            raise HTTPException(409, f"execution {execution_id!r} of this request is terminated")
        device = await _device_of(state.live[key].execution)
        return {"execution_id": execution_id, "task_id": task.task_id, "device": device}

    @app.get("/api/v1/{gym_id}/executions/{execution_id}/observation")
    async def observation(gym_id: str, execution_id: str) -> dict[str, Any]:
        live = state.execution(gym_id, execution_id)
        async with state.using(live):
            obs = await live.execution.observe()
        return await observation_to_json(obs)

    @app.post("/api/v1/{gym_id}/executions/{execution_id}/actions")
    async def actions(gym_id: str, execution_id: str, request: Request) -> dict[str, Any]:
        live = state.execution(gym_id, execution_id)
        body = await _json_object(request, allow_empty=False)
        if "action" not in body:
            raise HTTPException(422, "body field 'action' is required")
        try:
            action = action_from_json(body["action"])
        except ValidationError as exc:
            raise HTTPException(422, _action_error(exc)) from exc
        key = request.headers.get("idempotency-key")
        canonical = json.dumps(body["action"], sort_keys=True)
        async with state.using(live):
            if key is not None and key in live.acts:
                stored_action, answer = live.acts[key]
                if stored_action != canonical:
                    raise HTTPException(409, f"Idempotency-Key {key!r} was used for another action")
                log.info("repeated action key=%s path=%s: stored answer", key, request.url.path)
                return answer
            result = await live.execution.act(action)
            live.acted += 1
            answer = await step_result_to_json(result)
            if key is not None:
                live.acts[key] = (canonical, answer)
        return answer

    @app.post("/api/v1/{gym_id}/executions/{execution_id}/evaluate")
    async def evaluate(gym_id: str, execution_id: str, request: Request) -> dict[str, Any]:
        live = state.execution(gym_id, execution_id)
        body = await _json_object(request, allow_empty=True)
        answer = body.get("answer_text")
        data = body.get("execution_data")
        if answer is None and isinstance(data, dict) and isinstance(data.get("answer"), str):
            answer = data["answer"]
        if answer is not None and not isinstance(answer, str):
            raise HTTPException(422, "body field 'answer_text' must be a string")
        async with state.using(live):
            evaluation = await live.execution.evaluate(answer)
        return evaluation_to_json(evaluation)

    @app.post("/api/v1/{gym_id}/executions/{execution_id}/fork")
    async def fork(gym_id: str, execution_id: str) -> dict[str, Any]:
        live = state.execution(gym_id, execution_id)
        if state.held() >= limits.max_live:
            raise HTTPException(
                429,
                f"too many live executions: {state.held()} live or being created, the"
                f" server's max_live is {limits.max_live}",
                headers={"Retry-After": "5"},
            )
        try:
            async with state.using(live):
                copy = await fork_execution(live.execution)
        except ForkUnsupported as exc:
            raise HTTPException(501, f"fork unsupported: {exc}") from exc
        key = (gym_id, copy.execution_id)
        state.created.append(key)
        state.live[key] = _Live(copy, None, last_used=state.clock())
        return {"execution_id": copy.execution_id, "task_id": copy.task.task_id}

    @app.post("/api/v1/{gym_id}/executions/{execution_id}/terminate")
    async def terminate(gym_id: str, execution_id: str) -> dict[str, Any]:
        state.gym(gym_id)
        key = (gym_id, execution_id)
        state.terminate_requests[key] += 1
        live = state.live.pop(key, None)
        if live is None:
            if key in state.gone:
                return {"execution_id": execution_id, "terminated": True, "already": True}
            raise HTTPException(404, f"unknown execution {execution_id!r} in gym {gym_id!r}")
        if live.request_key is not None:
            # the client holds the id now and never re-sends this create
            state.by_request.pop(live.request_key, None)
        await state.close_execution(key, live.execution)
        return {"execution_id": execution_id, "terminated": True, "already": False}

    return app


def load_gym(spec: str, seed: int, screenshot_size: tuple[int, int] | None = None) -> Gym:
    """``sim`` (the embedded simulator, screenshots at ``screenshot_size`` if given) or
    ``package.module:factory`` called with ``seed=``."""
    if spec == "sim":
        from cua_native.gym.sim import SimGym

        return SimGym(seed=seed, screenshot_size=screenshot_size)
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"--gym must be 'sim' or 'package.module:factory', got {spec!r}")
    factory = getattr(importlib.import_module(module_name), attr)
    gym: Gym = factory(seed=seed)
    return gym


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5010)
    parser.add_argument("--gym", default="sim", help="'sim' or 'package.module:factory'")
    parser.add_argument("--gym-id", default=None, help="path id to serve it under")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--screenshot-size",
        default=None,
        help="sim only: screenshot WIDTHxHEIGHT (e.g. 160x384); the screen stays 1080x2400",
    )
    parser.add_argument("--fault-profile", default=None, help="JSON/YAML file or inline JSON")
    parser.add_argument(
        "--max-live",
        type=int,
        default=DEFAULT_MAX_LIVE,
        help="executions live or being created at most (429 beyond)",
    )
    parser.add_argument(
        "--idle-ttl-s",
        type=float,
        default=DEFAULT_IDLE_TTL_S,
        help="close executions idle this long (0: never)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="refuse larger request bodies (413)",
    )
    parser.add_argument(
        "--auth-token-env",
        default=None,
        metavar="VAR",
        help="require 'Authorization: Bearer $VAR' on every route (the token stays out of ps)",
    )
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    token = None
    if args.auth_token_env:
        token = os.environ.get(args.auth_token_env)
        if not token:
            parser.error(f"--auth-token-env: environment variable {args.auth_token_env} is unset")
    try:
        limits = ServerLimits(
            max_live=args.max_live,
            idle_ttl_s=args.idle_ttl_s or None,
            max_body_bytes=args.max_body_bytes,
            auth_token=token,
        )
    except ValueError as error:
        parser.error(str(error))
    logging.basicConfig(level=args.log_level.upper())
    size = None
    if args.screenshot_size:
        from cua_native.gym.sim.gym import parse_size

        try:
            size = parse_size(args.screenshot_size)
        except ValueError as error:
            parser.error(f"--screenshot-size: {error}")
    faults = None
    if args.fault_profile:  # before the gym loads: a typo costs a second
        try:
            faults = FaultProfile.load(args.fault_profile)
        except FaultProfileError as error:
            print(f"error: --fault-profile: {error}", file=sys.stderr)
            raise SystemExit(2) from None
    gym = load_gym(args.gym, args.seed, size)
    app = create_app({args.gym_id or gym.gym_id: gym}, faults, limits)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        asyncio.run(gym.aclose())


if __name__ == "__main__":
    main()
