"""HTTP client for a genv-compatible gym server (``docs/gym_protocol.md``).

One ``httpx.AsyncClient`` pool per ``HttpGym``; every call has its own timeout (create longest).
Retries only where safe: reads, evaluate and terminate are retried on transport errors, timeouts
and 5xx; an action POST only where the server honours idempotency keys (``idempotent_actions``:
a repeated key returns the stored result, the action runs once), else never (it could run
twice). A request that never reached the server (connect error, pool timeout) is retried on any
route.

Creating an execution is the delicate part: a create that timed out may still have created one.
``idempotent_create="auto"`` (the default) asks the server's capabilities route once, before the
first create: cua_native's server says it supports idempotent creates, genv answers 404 (no).
- Against genv (``idempotent_create=False``) the create is sent once; on a timeout the
  client raises ``GymTimeout`` and cannot learn the execution id, so it cannot terminate it.
- Against cua_native's server (``idempotent_create=True``) the options carry a client-generated
  ``client_request_id`` and ``client_deadline_s``: a retry with the same id returns the SAME
  execution, and a creation that outlives every client deadline is closed by the server itself.
  So the client retries a timed-out create safely, and if the caller is cancelled mid-create it
  reclaims the execution in the background (re-create with the same id, then terminate).
``HttpExecution.close`` terminates exactly once (shielded from cancellation, retried, never raises).
``held_executions`` asks a server that lists its executions how many of this client's creates it
still holds (the honest leak count). ``auth_token`` (or the environment variable named by
``auth_token_env``) is sent as ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import httpx

from cua_native.actions.models import Action, action_to_json
from cua_native.gym.protocol import (
    Evaluation,
    ExecutionGone,
    ForkUnsupported,
    GymError,
    Observation,
    StepResult,
    Task,
)
from cua_native.gym.wire import (
    WireError,
    evaluation_from_json,
    observation_from_json,
    step_result_from_json,
    task_from_json,
    tasks_from_json,
)

log = logging.getLogger(__name__)

BACKGROUND_WAIT_S = 30.0
"""How long a closing client waits for its background terminates and reclaims."""
RELEASE_POLL_S = 0.05
"""How often a closing client asks whether its creations still running have finished."""


class GymUnavailable(GymError):
    """The gym could not be reached, or dropped the connection before answering."""


class GymTimeout(GymError):
    """The gym did not answer within the call's timeout."""


class GymProtocolError(GymError):
    """The gym answered with something that is not the protocol's shape."""


class GymHTTPError(GymError):
    """The gym answered with an HTTP error status."""

    def __init__(self, status: int, detail: str, route: str = "") -> None:
        super().__init__(
            f"{route}: HTTP {status}: {detail}" if route else f"HTTP {status}: {detail}"
        )
        self.status = status
        self.detail = detail
        self.route = route


class TaskNotFound(GymHTTPError, LookupError):
    """404 on a task route."""


class ExecutionNotFound(GymHTTPError, ExecutionGone):
    """404 on an execution route: the execution is gone (terminated, expired, unknown)."""


@dataclass(frozen=True, slots=True)
class GymTimeouts:
    """Seconds per call (``connect`` applies to every call)."""

    connect: float = 10.0
    read: float = 60.0
    """Task list/detail and observation."""
    create: float = 600.0
    act: float = 120.0
    evaluate: float = 300.0
    terminate: float = 60.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 3
    """Total tries of a retry-safe call (reads, evaluate, terminate, idempotent create)."""
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    retry_statuses: frozenset[int] = frozenset({500, 502, 503, 504})
    throttle_retries: int = 3
    """Extra tries of any call answered 429 (the server did nothing: safe on every route),
    each after the answer's ``Retry-After`` (capped at ``backoff_max_s``; the backoff when
    it has none)."""

    def delay(self, attempt: int) -> float:
        return min(self.backoff_max_s, self.backoff_s * 2.0 ** (attempt - 1))

    def retry_after(self, response: httpx.Response, attempt: int) -> float:
        """Seconds to wait before retrying a 429 answer."""
        try:
            seconds = float(response.headers.get("retry-after", ""))
        except ValueError:
            return self.delay(attempt)
        return min(self.backoff_max_s, max(0.0, seconds))


@dataclass(slots=True)
class CallStats:
    """What a client's calls met: retries and the seconds spent waiting before them, 429s.
    Monotonic counters: a reader takes differences (the embedded trainer, per step)."""

    retries: int = 0
    throttled: int = 0
    wait_s: float = 0.0
    failed_s: float = 0.0
    """Seconds the retried attempts took before they failed (a timeout's whole limit)."""


@dataclass(frozen=True, slots=True)
class StepRoutes:
    """Path templates of the step-level routes (genv does not publish its own); placeholders
    ``{gym_id}`` and ``{execution_id}``."""

    observation: str = "/api/v1/{gym_id}/executions/{execution_id}/observation"
    actions: str = "/api/v1/{gym_id}/executions/{execution_id}/actions"


@dataclass(frozen=True, slots=True)
class _Call:
    route: str
    timeout: float
    retry: bool
    not_found: type[GymHTTPError] = GymHTTPError


class HttpGym:
    """``Gym`` over HTTP. Pass ``client`` to share a pool (then ``aclose`` leaves it open).
    ``timeouts``/``retries``/``routes`` also accept plain mappings (from YAML config)."""

    def __init__(
        self,
        base_url: str,
        gym_id: str,
        *,
        client: httpx.AsyncClient | None = None,
        timeouts: GymTimeouts | Mapping[str, float] = GymTimeouts(),
        retries: RetryPolicy | Mapping[str, Any] = RetryPolicy(),
        routes: StepRoutes | Mapping[str, str] = StepRoutes(),
        allowed_media_domains: Sequence[str] = (),
        idempotent_create: bool | Literal["auto"] = "auto",
        max_connections: int = 64,
        auth_token: str | None = None,
        auth_token_env: str | None = None,
    ) -> None:
        if not gym_id:
            raise ValueError("gym_id must be a non-empty string")
        if idempotent_create not in (True, False, "auto"):
            raise ValueError(
                f"idempotent_create must be true, false or 'auto', got {idempotent_create!r}"
            )
        if auth_token_env is not None:
            auth_token = os.environ.get(auth_token_env)
            if not auth_token:
                raise ValueError(f"auth_token_env: environment variable {auth_token_env} is unset")
        self._headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
        self.base_url = base_url.rstrip("/")
        self.gym_id = gym_id
        self.timeouts = timeouts if isinstance(timeouts, GymTimeouts) else GymTimeouts(**timeouts)
        if not isinstance(retries, RetryPolicy):
            retries = dict(retries)
            if "retry_statuses" in retries:
                retries["retry_statuses"] = frozenset(retries["retry_statuses"])
            retries = RetryPolicy(**retries)
        self.retries = retries
        self.routes = routes if isinstance(routes, StepRoutes) else StepRoutes(**routes)
        self.allowed_media_domains = tuple(allowed_media_domains)
        self.idempotent_create: bool | Literal["auto"] = idempotent_create
        self._capabilities: dict[str, Any] | None = None
        self._capabilities_lock = asyncio.Lock()
        self._request_ids: set[str] = set()
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )
        self._background: set[asyncio.Task[None]] = set()
        self.call_stats = CallStats()
        self._closed = False
        self.held_at_close: int | None = None
        """Set by ``aclose``: executions the server still held from this client's creates, once
        every terminate had run (``None``: unknown, e.g. genv)."""
        self.released_at_close = 0
        """Set by ``aclose``: live executions of this client's creates that no episode had
        closed, found and terminated by the close's last sweep (leaks it cleaned up)."""

    # -- plumbing -------------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def _gym_path(self, suffix: str) -> str:
        return f"/api/v1/{quote(self.gym_id, safe='')}{suffix}"

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _request(
        self,
        method: str,
        path: str,
        call: _Call,
        body: dict[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        if self._closed:
            raise GymUnavailable(f"{call.route}: HttpGym for {self.gym_id!r} is closed")
        timeout = httpx.Timeout(call.timeout, connect=self.timeouts.connect)
        attempts = max(1, self.retries.attempts)
        attempt = throttles = 0
        sent_headers = {**self._headers, **headers} if headers else self._headers
        while True:
            attempt += 1
            error: GymError
            wait: float | None = None
            began = time.monotonic()
            try:
                response = await self._client.request(
                    method, self._url(path), json=body, timeout=timeout, headers=sent_headers
                )
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                error, retry = GymUnavailable(f"{call.route}: cannot reach gym: {exc!r}"), True
                error.__cause__ = exc
            except httpx.TimeoutException as exc:
                error = GymTimeout(f"{call.route}: no answer within {call.timeout} s: {exc!r}")
                error.__cause__, retry = exc, call.retry
            except httpx.TransportError as exc:
                error = GymUnavailable(f"{call.route}: connection failed mid-request: {exc!r}")
                error.__cause__, retry = exc, call.retry
            else:
                if response.status_code < 400:
                    return response
                error = _http_error(response, call)
                retry = call.retry and response.status_code in self.retries.retry_statuses
                if response.status_code == 429:
                    self.call_stats.throttled += 1
                    throttles += 1
                    retry = throttles <= self.retries.throttle_retries
                    wait = self.retries.retry_after(response, throttles)
                    attempt -= 1  # a refused call is not one of the route's attempts
            if not retry or attempt >= attempts:
                raise error
            self.call_stats.failed_s += time.monotonic() - began
            wait = self.retries.delay(attempt) if wait is None else wait
            log.info(
                "%s failed (attempt %d/%d), retrying in %.1f s: %s",
                call.route,
                attempt,
                attempts,
                wait,
                error,
            )
            self.call_stats.retries += 1
            self.call_stats.wait_s += wait
            await asyncio.sleep(wait)

    async def _json(
        self, method: str, path: str, call: _Call, body: dict[str, Any] | None = None
    ) -> Any:
        response = await self._request(method, path, call, body)
        try:
            return response.json()
        except ValueError as exc:
            raise GymProtocolError(f"{call.route}: answer is not JSON: {exc}") from exc

    # -- Gym ------------------------------------------------------------------------------------

    async def list_tasks(self) -> list[Task]:
        data = await self._json(
            "GET", self._gym_path("/tasks"), _Call("list_tasks", self.timeouts.read, True)
        )
        try:
            return tasks_from_json(data)
        except WireError as exc:
            raise GymProtocolError(f"list_tasks: {exc}") from exc

    async def get_task(self, task_id: str) -> Task:
        call = _Call("get_task", self.timeouts.read, True, TaskNotFound)
        data = await self._json("GET", self._gym_path(f"/tasks/{quote(task_id, safe='')}"), call)
        try:
            return task_from_json(data)
        except WireError as exc:
            raise GymProtocolError(f"get_task: {exc}") from exc

    async def capabilities(self) -> dict[str, Any]:
        """The server's capabilities route, read once; ``{}`` for a server without one (genv)."""
        async with self._capabilities_lock:
            if self._capabilities is None:
                call = _Call("capabilities", self.timeouts.read, True)
                try:
                    data = await self._json("GET", self._gym_path("/capabilities"), call)
                except GymHTTPError as exc:
                    if not 400 <= exc.status < 500:
                        raise
                    data = {}
                self._capabilities = data if isinstance(data, dict) else {}
            return self._capabilities

    async def replays_exactly(self) -> bool:
        """Whether the server says its gym replays exactly (``ReplayableGym``; capabilities'
        ``replays_exactly``): ``False`` for a server that does not say so (genv)."""
        return (await self.capabilities()).get("replays_exactly") is True

    async def idempotent_actions(self) -> bool:
        """Whether the server honours an ``Idempotency-Key`` on actions (capabilities'
        ``idempotent_actions``): then an action is retried like a read (``HttpExecution.act``)."""
        return (await self.capabilities()).get("idempotent_actions") is True

    async def _idempotent(self) -> bool:
        if self.idempotent_create == "auto":
            caps = await self.capabilities()
            self.idempotent_create = caps.get("idempotent_create") is True
            log.info("gym %s: idempotent creates %s", self.gym_id, self.idempotent_create)
        return bool(self.idempotent_create)

    async def held_executions(self) -> int | None:
        """Executions the server still holds from this client's creates: live ones, and creations
        still running whose deadline has not passed (those past it the server closes itself).
        ``None`` when the server cannot list its executions (genv)."""
        if not (await self.capabilities()).get("executions_listing"):
            return None
        call = _Call("executions", self.timeouts.read, True)
        data = await self._json("GET", self._gym_path("/executions"), call)
        if not isinstance(data, dict):
            raise GymProtocolError("executions: answer is not an object")
        live = [e for e in data.get("executions") or [] if isinstance(e, dict)]
        creating = [c for c in data.get("creating") or [] if isinstance(c, dict)]
        held = sum(e.get("client_request_id") in self._request_ids for e in live)
        held += sum(
            c.get("client_request_id") in self._request_ids and not c.get("expired")
            for c in creating
        )
        return held

    async def start(self, task: Task, options: dict[str, Any] | None = None) -> HttpExecution:
        body_options = dict(options or {})
        idempotent = await self._idempotent()
        if idempotent:
            request_id = uuid.uuid4().hex
            self._request_ids.add(request_id)
            body_options["client_request_id"] = request_id
            body_options["client_deadline_s"] = self.timeouts.create
        path = self._gym_path(f"/tasks/{quote(task.task_id, safe='')}")
        call = _Call("create", self.timeouts.create, idempotent, TaskNotFound)
        body = {"options": body_options}
        try:
            data = await self._json("POST", path, call, body)
        except asyncio.CancelledError:
            if idempotent:
                self._spawn(self._reclaim(path, body))
            raise
        execution_id = data.get("execution_id") if isinstance(data, dict) else None
        if not isinstance(execution_id, str | int) or isinstance(execution_id, bool):
            raise GymProtocolError(f"create: answer has no 'execution_id': {str(data)[:200]}")
        device = data.get("device") if isinstance(data.get("device"), dict) else {}
        return HttpExecution(self, str(execution_id), task, device=device, created=data)

    async def _reclaim(self, path: str, body: dict[str, Any]) -> None:
        """After a cancelled create: get the execution it made (same request id), terminate it."""
        try:
            data = await self._json(
                "POST", path, _Call("create", self.timeouts.create, True, TaskNotFound), body
            )
            execution_id = data.get("execution_id") if isinstance(data, dict) else None
            if execution_id is not None:
                await self._terminate(str(execution_id))
        except GymError as exc:
            log.info("reclaim after a cancelled create found nothing to release: %s", exc)
        except Exception:
            log.exception("reclaim after a cancelled create failed")

    async def _terminate(self, execution_id: str) -> bool:
        """Terminate with retries; ``True`` when the gym confirmed (or it was already gone)."""
        path = self._gym_path(f"/executions/{quote(execution_id, safe='')}/terminate")
        call = _Call("terminate", self.timeouts.terminate, True, ExecutionNotFound)
        try:
            await self._request("POST", path, call)
            return True
        except ExecutionNotFound:
            log.info("terminate: execution %s was already gone", execution_id)
            return True
        except GymError as exc:
            log.warning("terminate of execution %s failed: %s", execution_id, exc)
            return False
        except Exception:
            log.exception("terminate of execution %s failed", execution_id)
            return False

    async def _release_held(self) -> None:
        """The last sweep of a closing client (servers that list executions): creations of this
        client still running are waited for (bounded by the create timeout; past their deadline
        the server closes them itself), then every live execution the server lists under one of
        this client's create request ids is terminated — a create whose answer no episode used
        (abandoned, its background reclaim cut short) leaves nothing behind."""
        if not (await self.capabilities()).get("executions_listing"):
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeouts.create
        while True:
            call = _Call("executions", self.timeouts.read, True)
            data = await self._json("GET", self._gym_path("/executions"), call)
            if not isinstance(data, dict):
                raise GymProtocolError("executions: answer is not an object")
            creating = [
                c
                for c in data.get("creating") or []
                if isinstance(c, dict)
                and c.get("client_request_id") in self._request_ids
                and not c.get("expired")
            ]
            if not creating or loop.time() >= deadline:
                break
            await asyncio.sleep(RELEASE_POLL_S)
        for entry in data.get("executions") or []:
            if (
                isinstance(entry, dict)
                and entry.get("client_request_id") in self._request_ids
                and entry.get("execution_id") is not None
            ):
                log.info(
                    "releasing execution %s: created for this client, never closed",
                    entry["execution_id"],
                )
                await self._terminate(str(entry["execution_id"]))
                self.released_at_close += 1

    async def aclose(self) -> None:
        """Wait (bounded) for background terminates/reclaims, release what the server still
        holds from this client's creates (``_release_held``), note ``held_at_close``, then close
        an owned pool."""
        if self._closed:
            return
        if self._background:
            _done, pending = await asyncio.wait(set(self._background), timeout=BACKGROUND_WAIT_S)
            for task in pending:
                task.cancel()
        if self._request_ids:
            try:
                await self._release_held()
                self.held_at_close = await self.held_executions()
            except Exception as exc:  # a last sweep and a report; they must not fail the close
                log.warning("could not ask gym %s what it still holds: %s", self.gym_id, exc)
        self._closed = True
        if self._owns_client:
            await self._client.aclose()


@dataclass(eq=False)
class HttpExecution:
    """``Execution`` of an ``HttpGym``. ``device`` is the create answer's device object (genv:
    ``device_serial``; ours: ``width``/``height``); ``created`` the whole answer."""

    gym: HttpGym
    execution_id: str
    task: Task
    device: dict[str, Any] = field(default_factory=dict)
    created: dict[str, Any] = field(default_factory=dict)
    _closing: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _acts: int = field(default=0, init=False, repr=False)
    """Actions sent so far: the next action's idempotency key is ``{execution_id}:{_acts}``."""
    terminated: bool | None = field(default=None, init=False)
    """After ``close``: whether the gym confirmed the terminate."""

    def _path(self, template: str) -> str:
        return template.format(
            gym_id=quote(self.gym.gym_id, safe=""),
            execution_id=quote(self.execution_id, safe=""),
        )

    def _exec_path(self, suffix: str) -> str:
        return self.gym._gym_path(f"/executions/{quote(self.execution_id, safe='')}{suffix}")

    def _check_open(self, route: str) -> None:
        if self._closing is not None:
            raise ExecutionGone(f"{route}: execution {self.execution_id} is closed")

    async def observe(self) -> Observation:
        self._check_open("observation")
        call = _Call("observation", self.gym.timeouts.read, True, ExecutionNotFound)
        response = await self.gym._request("GET", self._path(self.gym.routes.observation), call)
        return await asyncio.to_thread(
            _decode, response.content, observation_from_json, self.gym.allowed_media_domains
        )

    async def act(self, action: Action) -> StepResult:
        """Against a server that honours idempotency keys (``idempotent_actions``) the action
        carries ``Idempotency-Key: {execution_id}:{n}`` (its n-th action) and is retried like
        a read (timeouts, dropped connections, 5xx): the server answers a repeated key with
        the stored result and does not act twice. Against any other server it is never
        retried once sent (a 429 is: nothing ran). A 4xx other than 404, 429 (and, with a
        key, 409: the key was used for another action) means the gym refused the action: an
        ``ok=False`` result for the agent, and the execution stays usable. A 429 still refused
        after the client's tries is the gym's failure, never the agent's: it raises (the
        episode is rejected, not trained on)."""
        self._check_open("actions")
        keyed = await self.gym.idempotent_actions()
        headers = None
        if keyed:
            headers = {"Idempotency-Key": f"{self.execution_id}:{self._acts}"}
            self._acts += 1
        call = _Call("actions", self.gym.timeouts.act, keyed, ExecutionNotFound)
        body = {"action": action_to_json(action)}
        try:
            response = await self.gym._request(
                "POST", self._path(self.gym.routes.actions), call, body, headers
            )
        except ExecutionNotFound:
            raise
        except GymHTTPError as exc:
            infrastructure = exc.status == 429 or (keyed and exc.status == 409)
            if 400 <= exc.status < 500 and not infrastructure:
                return StepResult(ok=False, error=f"gym refused the action: {exc.detail}")
            raise
        return await asyncio.to_thread(
            _decode, response.content, step_result_from_json, self.gym.allowed_media_domains
        )

    async def evaluate(self, answer: str | None = None) -> Evaluation:
        self._check_open("evaluate")
        body: dict[str, Any] = {"execution_data": {} if answer is None else {"answer": answer}}
        if answer is not None:
            body["answer_text"] = answer
        call = _Call("evaluate", self.gym.timeouts.evaluate, True, ExecutionNotFound)
        data = await self.gym._json("POST", self._exec_path("/evaluate"), call, body)
        try:
            return evaluation_from_json(data)
        except WireError as exc:
            raise GymProtocolError(f"evaluate: {exc}") from exc

    async def fork(self) -> HttpExecution:
        """``POST …/fork``: a new execution in exactly this one's state (the server copies it).
        ``ForkUnsupported`` when the server answers 501 (its gym cannot fork) or 404/405 on the
        route (a server without it, genv); never retried (a retry could leave a second copy)."""
        self._check_open("fork")
        call = _Call("fork", self.gym.timeouts.create, False, ExecutionNotFound)
        try:
            data = await self.gym._json("POST", self._exec_path("/fork"), call, {})
        except ExecutionNotFound:
            raise
        except GymHTTPError as exc:
            if exc.status in (404, 405, 501):
                raise ForkUnsupported(f"gym {self.gym.gym_id!r} cannot fork: {exc}") from exc
            raise
        execution_id = data.get("execution_id") if isinstance(data, dict) else None
        if not isinstance(execution_id, str) or not execution_id:
            raise GymProtocolError(f"fork: answer has no execution_id: {data!r}")
        return HttpExecution(self.gym, execution_id, self.task, dict(self.device), dict(data))

    async def close(self) -> None:
        """Terminate exactly once. Shielded: cancelling ``close`` does not stop the terminate
        (the gym's ``aclose`` waits for it). Never raises for gym failures; logs them."""
        if self._closing is None:
            self._closing = self.gym._spawn(self._run_terminate())
        try:
            await asyncio.shield(self._closing)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            # the terminate itself was cancelled (the gym's aclose gave up waiting): logged, done
            log.warning("terminate of execution %s was cancelled", self.execution_id)

    async def _run_terminate(self) -> None:
        self.terminated = await self.gym._terminate(self.execution_id)


def _decode(content: bytes, parse: Any, allowed: Sequence[str]) -> Any:
    try:
        return parse(json.loads(content), allowed)
    except (ValueError, WireError) as exc:
        raise GymProtocolError(f"malformed gym answer: {exc}") from exc


def _http_error(response: httpx.Response, call: _Call) -> GymHTTPError:
    try:
        detail = response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        detail = response.text
    if not isinstance(detail, str):
        detail = json.dumps(detail)
    cls = call.not_found if response.status_code == 404 else GymHTTPError
    return cls(response.status_code, detail[:2000], call.route)
