"""Restore a lost execution by replaying its actions on a fresh one (recovery at the call).

``ReplayingExecution`` wraps an execution of a gym that declares exact replay
(``protocol.ReplayableGym``: the same task, started with the same options and given the same
actions, shows the same observations). It records every action the environment answered and
the last observation seen (hashed only when a restore checks it: nothing mutates an
observation once returned, and hashing every screen would cost every turn). When a call fails
with a ``GymError`` that may have lost the execution (404 after a crash, a call still failing
after the client's own retries; not a 4xx refusing the request itself), it closes the old
execution, starts a fresh one of the same task, replays the recorded actions in order, and
checks the restored state: every replayed action must be answered as before (``ok``), and the
observation at the point of the last one seen must have the same digest. Only then does the
failed call run again, on the fresh execution. A restore that cannot be checked or does not
match raises ``RecoveryFailed`` (the episode is rejected, as without recovery); so does
running out of ``max_replays``. Nothing is guessed: a gym that does not declare exact replay
is never wrapped (``gym_replays_exactly``).

The lost executions' ids, the actions replayed and the seconds spent are kept on the wrapper
(``lost``, ``replayed_actions``, ``seconds``) for the episode's record.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from cua_native.actions.models import Action
from cua_native.gym.protocol import (
    Evaluation,
    Execution,
    Gym,
    GymError,
    Observation,
    StepResult,
    Task,
    fork_execution,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

CLOSE_LOST_TIMEOUT_S = 30.0


class RecoveryFailed(GymError):
    """A lost execution could not be restored exactly: the episode cannot continue."""


def observation_digest(observation: Observation) -> str:
    """SHA-256 of what an observation shows: size, turn and the screenshot's content (its
    encoded bytes, its pixels, or its URL: a URL that changes between two executions makes
    the check fail, never pass wrongly)."""
    digest = hashlib.sha256(f"{observation.width}x{observation.height}:{observation.turn}".encode())
    shot = observation.screenshot
    if shot.png is not None:
        digest.update(b"png:" + shot.png)
    elif shot.image is not None:
        image = shot.image
        digest.update(f"image:{image.mode}:{image.size}:".encode())
        digest.update(image.tobytes())
    else:
        digest.update(f"url:{shot.url}".encode())
    return digest.hexdigest()


class ReplayingExecution:
    """An ``Execution`` that restores itself after a loss by exact replay (module docstring).

    ``options`` are the ones the execution was started with (a restore starts the fresh one
    with the same). ``clock`` measures ``seconds`` (tests inject one)."""

    def __init__(
        self,
        gym: Gym,
        task: Task,
        inner: Execution,
        *,
        options: dict[str, Any] | None = None,
        max_replays: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gym = gym
        self._task = task
        self._inner = inner
        self._options = dict(options) if options else None
        self.replays_left = max_replays
        self._clock = clock
        self._actions: list[tuple[Action, bool]] = []
        """Every action the environment answered, with its ``ok``."""
        self._seen: tuple[int, Observation] | None = None
        """(actions applied, observation) of the last observation seen; its digest is taken
        only when a restore checks it (hashing every screen would cost each turn)."""
        self.lost: list[str] = []
        """Ids of executions lost and replaced by a restored one, in order."""
        self.replayed_actions = 0
        self.seconds = 0.0

    @property
    def execution_id(self) -> str:
        """The id of the execution in use now (a restore changes it)."""
        return self._inner.execution_id

    @property
    def task(self) -> Task:
        return self._task

    def _saw(self, observation: Observation | None) -> None:
        if observation is not None:
            self._seen = (len(self._actions), observation)

    async def observe(self) -> Observation:
        observation = await self._call(lambda execution: execution.observe())
        self._saw(observation)
        return observation

    async def act(self, action: Action) -> StepResult:
        result = await self._call(lambda execution: execution.act(action))
        self._actions.append((action, result.ok))
        self._saw(result.observation)
        return result

    async def evaluate(self, answer: str | None = None) -> Evaluation:
        return await self._call(lambda execution: execution.evaluate(answer))

    async def fork(self) -> ReplayingExecution:
        """The inner execution's fork (``ForkUnsupported`` where it has none), itself
        replayable: same task, the same actions so far, the same last observation."""
        copy = await fork_execution(self._inner)
        forked = ReplayingExecution(
            self._gym,
            self._task,
            copy,
            options=self._options,
            max_replays=self.replays_left,
            clock=self._clock,
        )
        forked._actions = list(self._actions)
        forked._seen = self._seen
        return forked

    async def close(self) -> None:
        await self._inner.close()

    async def _call(self, call: Callable[[Execution], Awaitable[T]]) -> T:
        while True:
            try:
                return await call(self._inner)
            except RecoveryFailed:
                raise
            except GymError as error:
                if self.replays_left <= 0 or not _lost(error):
                    raise
                log.info(
                    "execution %s of task %s lost (%s); restoring it by replaying %d actions",
                    self._inner.execution_id,
                    self._task.task_id,
                    error,
                    len(self._actions),
                )
                await self._restore(error)

    async def _restore(self, cause: GymError) -> None:
        """Replace the lost execution by a fresh one replayed to the same state; each failed
        try costs one of ``replays_left``."""
        started = self._clock()
        lost = self._inner
        self.lost.append(lost.execution_id)
        try:
            await _close_quietly(lost)
            while True:
                self.replays_left -= 1
                fresh: Execution | None = None
                try:
                    fresh = await _start_owned(self._gym, self._task, self._options)
                    await self._replay(fresh)
                except RecoveryFailed:
                    await _close_quietly(fresh)
                    raise
                except GymError as error:
                    await _close_quietly(fresh)
                    if self.replays_left <= 0:
                        raise RecoveryFailed(
                            f"restoring execution {lost.execution_id} failed: {error}"
                        ) from cause
                    continue
                except BaseException:
                    await _close_quietly(fresh)
                    raise
                self._inner = fresh
                return
        finally:
            self.seconds += self._clock() - started

    async def _replay(self, fresh: Execution) -> None:
        """Apply the recorded actions to ``fresh`` and check the state they lead to."""
        seen_at, last = self._seen if self._seen is not None else (None, None)
        seen = observation_digest(last) if last is not None else None
        shown: Observation | None = None
        if seen_at == 0:
            shown = await fresh.observe()
        for index, (action, ok) in enumerate(self._actions):
            if seen_at is not None and index == seen_at and shown is None:
                shown = await fresh.observe()
            result = await fresh.act(action)
            self.replayed_actions += 1
            if result.ok != ok:
                raise RecoveryFailed(
                    f"replay diverged on {self._task.task_id}: action {index + 1} "
                    f"({action.type}) answered ok={result.ok}, first time ok={ok}"
                )
            if index + 1 == seen_at:
                shown = result.observation
        if seen_at is not None and shown is None:  # the act answered without a screen
            shown = await fresh.observe()
        if seen is not None and (shown is None or observation_digest(shown) != seen):
            raise RecoveryFailed(
                f"replay of {self._task.task_id} on {fresh.execution_id} does not show the "
                f"screen last seen (after {seen_at} actions): the state cannot be trusted"
            )


def _lost(error: GymError) -> bool:
    """Whether a failed call may have lost the execution: anything but an answer refusing the
    request itself (a 4xx other than 404 gone, 408 timeout, 429 throttled), which a fresh
    execution would refuse too."""
    status = getattr(error, "status", None)
    return not (isinstance(status, int) and 400 <= status < 500 and status not in (404, 408, 429))


async def _close_quietly(execution: Execution | None) -> None:
    if execution is None:
        return
    try:
        await asyncio.wait_for(execution.close(), CLOSE_LOST_TIMEOUT_S)
    except Exception as error:
        log.warning("closing execution %s failed: %s", execution.execution_id, error)


async def _start_owned(gym: Gym, task: Task, options: dict[str, Any] | None) -> Execution:
    """``gym.start``; cancelled meanwhile, the execution it still makes is closed."""
    creating = asyncio.ensure_future(gym.start(task, options))
    try:
        return await asyncio.shield(creating)
    except asyncio.CancelledError:
        creating.add_done_callback(_close_orphan)
        raise


def _close_orphan(creating: asyncio.Future[Execution]) -> None:
    if creating.cancelled() or creating.exception() is not None:
        return
    closing = asyncio.ensure_future(creating.result().close())
    closing.add_done_callback(lambda done: done.cancelled() or done.exception())
