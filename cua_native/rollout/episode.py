"""One episode: observe → prompt → generate → parse → act, until the agent stops or runs out.

``run_with_retry`` is the entry the workflow calls. An episode never raises for environment or
engine trouble: infrastructure failures come back as a ``rejected`` record (retried here on a
fresh execution); agent failures (unparseable output, out of turns or time, a wrong answer) are
``completed`` records with their reward. The execution is closed on every path, cancellation
included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from areal.api.io_struct import ModelRequest, ModelResponse

from cua_native.actions.errors import ParsedOutput
from cua_native.actions.models import Answer, Terminate
from cua_native.engine.prompt_report import prompt_report
from cua_native.engine.versions import served_versions
from cua_native.gym.protocol import (
    Execution,
    Gym,
    Observation,
    Task,
    final_answer,
    gym_replays_exactly,
)
from cua_native.gym.recovery import ReplayingExecution
from cua_native.prompts import HistoryStep, PreparedImage, PromptTooLong
from cua_native.prompts.pixels import PromptPixels
from cua_native.rollout.agent import Agent, feedback_for
from cua_native.rollout.cpu_pool import WORK_RANK, ranked
from cua_native.rollout.pause_clock import clock_timeout
from cua_native.rollout.records import (
    BranchOrigin,
    EndReason,
    EpisodeContext,
    EpisodeObserver,
    EpisodeRecord,
    Phase,
    TurnRecord,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

Clock = Callable[[], float]
"""Seconds on a monotonic clock; the episode's time budget is measured on it."""


async def run_with_retry(
    *,
    gym: Gym,
    task: Task,
    engine: Engine,
    agent: Agent,
    make_context: Callable[[int], EpisodeContext],
    observer: EpisodeObserver,
    on_reject: Callable[[EpisodeRun], None] = lambda run: None,
    clock: Clock = time.monotonic,
    branch: BranchHook | None = None,
) -> EpisodeRun:
    """Run an episode; an infrastructure rejection is retried on a fresh execution up to
    ``agent.config.infra_retries`` times. Returns the last run (``rejected`` if every attempt
    was). ``branch`` may fork it into siblings (``rollout/branching.py``)."""
    attempt = 0
    while True:
        context = make_context(attempt)
        episode = Episode(gym, task, engine, agent, context, observer, clock, branch=branch)
        run = await episode.run()
        if not run.rejected:
            return run
        on_reject(run)
        if attempt >= agent.config.infra_retries:
            return run
        attempt += 1


async def run_episode(
    *,
    gym: Gym,
    task: Task,
    engine: Engine,
    agent: Agent,
    context: EpisodeContext,
    observer: EpisodeObserver,
    clock: Clock = time.monotonic,
) -> EpisodeRun:
    """Run one episode of ``task`` on a fresh execution of ``gym`` and return its record."""
    return await Episode(gym, task, engine, agent, context, observer, clock).run()


class Engine(Protocol):
    """The part of AReaL's ``InferenceEngine`` the loop uses."""

    async def agenerate(self, req: ModelRequest) -> ModelResponse: ...


class InfraFailure(Exception):
    """The environment or the engine failed; the episode cannot be trained on."""

    def __init__(self, reason: EndReason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else str(reason))
        self.reason = reason


class _OutOfTime(Exception):
    """The episode's time budget ran out inside a turn."""


@dataclass(slots=True)
class EpisodeRun:
    """An episode's record plus, per turn, the image tensors of its prompt (by reference:
    ``PromptPixels.tensors()`` concatenates them when the training row is built)."""

    record: EpisodeRecord
    prompt_pixels: list[PromptPixels] = field(default_factory=list)

    @property
    def rejected(self) -> bool:
        return self.record.outcome == "rejected"


DEADLINE_SLACK_S = 0.05
"""A timeout this close to the episode deadline is the deadline: the event loop may fire a
timer a little early, and its clock is not the one the deadline was taken from."""


class Deadline:
    """The episode's time budget on ``clock`` (inject another clock to change what counts as
    the episode's time)."""

    def __init__(self, seconds: float, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self.at = clock() + seconds

    def remaining(self) -> float:
        return self.at - self.clock()

    def expired(self) -> bool:
        """Whether the budget has run out (within ``DEADLINE_SLACK_S``)."""
        return self.remaining() <= DEADLINE_SLACK_S

    def budget(self, limit: float) -> float:
        """The timeout of the next call: ``limit`` or what is left, ``_OutOfTime`` if nothing."""
        remaining = self.remaining()
        if remaining <= 0:
            raise _OutOfTime
        return min(limit, remaining)


class PhaseTimer:
    """Adds phase durations to the turn's and the episode's timing tables."""

    def __init__(self, episode: dict[str, float]) -> None:
        self.episode = episode

    @contextmanager
    def phase(self, name: Phase, turn: dict[str, float] | None = None) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            self.episode[name] = self.episode.get(name, 0.0) + spent
            if turn is not None:
                turn[name] = turn.get(name, 0.0) + spent


@dataclass(slots=True)
class _Screen:
    """The screen the next turn shows: the observation and, once prepared, its model image
    (a parse-error turn shows the same screen again without preparing it twice)."""

    observation: Observation
    prepared: PreparedImage | None = None


class BranchHook(Protocol):
    """Called after each model turn, before its action is applied (``rollout/branching.py``):
    the moment the execution still shows the screen the turn was sampled from. It may fork the
    execution and start siblings (``Episode.sibling``) and records that in
    ``episode.record.branched_at``."""

    async def after_model_turn(self, episode: Episode, index: int, turn: TurnRecord) -> None: ...


@dataclass(slots=True)
class Resume:
    """Where a sibling starts: a forked execution, the history and screen of its parent at the
    fork turn ``index``."""

    execution: Execution
    index: int
    history: list[HistoryStep]
    screen: _Screen
    origin: BranchOrigin


class Episode:
    """One episode of ``task`` on a fresh execution of ``gym``, the model side in ``agent``;
    or, with ``resume``, a sibling that continues a forked execution from its parent's turn."""

    def __init__(
        self,
        gym: Gym,
        task: Task,
        engine: Engine,
        agent: Agent,
        context: EpisodeContext,
        observer: EpisodeObserver,
        clock: Clock = time.monotonic,
        *,
        branch: BranchHook | None = None,
        resume: Resume | None = None,
    ) -> None:
        self.gym = gym
        self.branch = branch
        self.resume = resume
        self.task = task
        self.engine = engine
        self.agent = agent
        self.config = agent.config
        self.context = context
        self.observer = observer
        self.record = EpisodeRecord(context=context)
        self.result = EpisodeRun(record=self.record)
        self.timer = PhaseTimer(self.record.timings)
        self.deadline = Deadline(self.config.episode_timeout_s, clock)
        self.started = time.monotonic()
        """The episode's place in the CPU pool's order (``cpu_pool.WORK_RANK``)."""
        self.history: list[HistoryStep] = list(resume.history) if resume is not None else []
        self.execution: Execution | None = resume.execution if resume is not None else None
        self.screen: _Screen | None = None
        """The screen the current turn was sampled from (what a sibling starts on)."""
        if resume is not None:
            self.record.origin = resume.origin

    def sibling(self, execution: Execution, index: int, context: EpisodeContext) -> Episode:
        """A new episode on ``execution`` (a fork of this one's, taken before turn ``index``'s
        action): same task, engine, agent, observer, clock and branch hook, this episode's
        history and screen; it samples its own turn ``index`` and goes on from there."""
        assert self.screen is not None, "siblings start at a model turn"
        origin = BranchOrigin(parent_id=self.context.episode_id, turn=index)
        resume = Resume(execution, index, list(self.history), self.screen, origin)
        return Episode(
            self.gym,
            self.task,
            self.engine,
            self.agent,
            context,
            self.observer,
            self.deadline.clock,
            branch=self.branch,
            resume=resume,
        )

    async def run(self) -> EpisodeRun:
        """Create, play the turns, evaluate; close on every path. Never raises for
        infrastructure trouble (the record is ``rejected`` instead)."""
        record = self.record
        with ranked((0, self.started)):  # _play moves it on per turn
            notify(self.observer, "episode_started", self.context)
            try:
                await self._create_play_evaluate()
            except InfraFailure as failure:
                record.outcome = "rejected"
                record.reject_reason = failure.reason
                record.end_reason = failure.reason
                logger.warning("episode %s rejected: %s", self.context.episode_id, failure)
            finally:
                self._note_recovery()
                if self.execution is not None:
                    with self.timer.phase("close"):
                        await close_execution(self.execution, self.config.close_timeout_s)
        notify(self.observer, "episode_finished", record)
        return self.result

    def _note_recovery(self) -> None:
        """The restores of a replaying execution, in the record; the execution the episode
        ends on is its ``context.execution_id``."""
        execution = self.execution
        if isinstance(execution, ReplayingExecution):
            self.record.lost_executions = list(execution.lost)
            self.record.replayed_actions = execution.replayed_actions
            self.record.recovery_s = execution.seconds
            self.context.execution_id = execution.execution_id

    async def _create_play_evaluate(self) -> None:
        record, config = self.record, self.config
        if self.execution is None:
            with self.timer.phase("create"):
                execution = await _start(self.gym, self.task, config.turn_timeout_s)
                self.execution = execution
                if config.recovery.replay and await _replays(self.gym, config.turn_timeout_s):
                    self.execution = ReplayingExecution(
                        self.gym,
                        self.task,
                        execution,
                        max_replays=config.recovery.max_replays,
                    )
        execution = self.execution
        self.context.execution_id = execution.execution_id
        record.end_reason = await self._play(execution)
        with self.timer.phase("evaluate"):
            evaluation = await _guarded(
                execution.evaluate(record.answer),
                reason=EndReason.EVALUATE,
                limit=config.turn_timeout_s,
            )
        if not math.isfinite(evaluation.reward):  # never trained on: the gym is broken
            raise InfraFailure(EndReason.BAD_REWARD, f"the gym's reward is {evaluation.reward!r}")
        record.evaluation = evaluation
        record.success = evaluation.success
        errors = sum(record.parse_errors.values())
        record.reward = evaluation.reward - config.format_penalty * errors

    async def _play(self, execution: Execution) -> EndReason:
        """Turns until one ends the episode; how it ended."""
        screen: _Screen | None = None
        first = 0
        if self.resume is not None:
            screen, first = self.resume.screen, self.resume.index
        consecutive_errors = 0
        for index in range(first, self.config.max_turns):
            WORK_RANK.set((index, self.started))  # restored by run()
            if self.deadline.remaining() <= 0:
                return EndReason.TIME_LIMIT
            try:
                end, screen, parsed = await self._turn(index, execution, screen)
            except _OutOfTime:
                return EndReason.TIME_LIMIT
            except PromptTooLong:
                # Even the minimal prompt overflows the context: the agent's episode ends here.
                return EndReason.CONTEXT_LIMIT
            if end is not None:
                return end
            consecutive_errors = consecutive_errors + 1 if parsed.error is not None else 0
            if consecutive_errors >= self.config.max_consecutive_parse_errors:
                return EndReason.PARSE_ERRORS
        return EndReason.MAX_TURNS

    async def _turn(
        self, index: int, execution: Execution, screen: _Screen | None
    ) -> tuple[EndReason | None, _Screen | None, ParsedOutput]:
        """One turn: observe (unless the screen is known), prompt, generate, parse, act.
        Returns the ending it reached (if any), the next turn's screen (``None``: observe)
        and what was parsed."""
        config = self.config
        timings: dict[str, float] = {}
        if screen is None:
            with self.timer.phase("observe", timings):
                observation = await _guarded(
                    execution.observe(),
                    reason=EndReason.OBSERVE,
                    limit=self.deadline.budget(config.turn_timeout_s),
                    out_of_time=self.deadline.expired,
                )
            screen = _Screen(observation)
        turn, pixels, prepared = await self._model_turn(index, screen, timings)
        screen.prepared = prepared
        self.record.turns.append(turn)
        self.result.prompt_pixels.append(pixels)
        if self.branch is not None:
            self.screen = screen
            async with self._turn_told(turn):
                await self.branch.after_model_turn(self, index, turn)
        parsed = turn.parsed
        action = parsed.action if parsed.error is None else None
        if isinstance(action, Answer | Terminate):
            self.record.answer = final_answer(action)
            notify(self.observer, "turn_finished", self.context, turn)
            return (
                (EndReason.ANSWER if isinstance(action, Answer) else EndReason.TERMINATE),
                None,
                parsed,
            )
        next_screen: _Screen | None = screen
        if action is not None:
            with self.timer.phase("act", timings):
                async with self._turn_told(turn):
                    turn.step = await _guarded(
                        execution.act(action), reason=EndReason.ACT, limit=config.turn_timeout_s
                    )
            # The act's own observation saves a call; without one the next turn observes.
            observed = turn.step.observation
            next_screen = _Screen(observed) if observed is not None else None
        self.history.append(
            HistoryStep(
                screenshot=prepared,
                parsed=parsed,
                raw_text=turn.text,
                feedback=feedback_for(parsed, turn.step),
            )
        )
        notify(self.observer, "turn_finished", self.context, turn)
        return None, next_screen, parsed

    @contextlib.asynccontextmanager
    async def _turn_told(self, turn: TurnRecord) -> AsyncIterator[None]:
        """A turn in the record is told to the observer even when its action fails: the
        episode's end marks its last turn, which a store must already hold."""
        try:
            yield
        except InfraFailure:
            notify(self.observer, "turn_finished", self.context, turn)
            raise

    async def _model_turn(
        self, index: int, screen: _Screen, timings: dict[str, float]
    ) -> tuple[TurnRecord, PromptPixels, PreparedImage]:
        """Prompt, generate and parse: the turn, its prompt's multimodal input, and the
        prepared screenshot (for the history)."""
        agent, context = self.agent, self.context
        with self.timer.phase("prompt", timings):
            built = await _guarded(
                agent.prompt(
                    self.task,
                    self.history,
                    screen.prepared or screen.observation.screenshot,
                ),
                reason=EndReason.PROMPT,
                limit=self.deadline.budget(self.config.turn_timeout_s),
                out_of_time=self.deadline.expired,
            )
        prepared = built.current
        if prepared is None:
            raise InfraFailure(EndReason.PROMPT, "the builder returned no prepared screenshot")
        request = built.request
        # Identity for engines and traces (AReaL's engines ignore unknown metadata keys).
        request.metadata.setdefault("episode_id", context.episode_id)
        # One request id for all the episode's turns: AReaL's remote engine sends requests
        # with the same ``rid`` to the same server (RemoteInfEngine.rid_to_address), whose
        # prefix cache then holds the earlier turns (docs/contracts.md#one-request-id-per-episode).
        request.rid = context.episode_id
        request.metadata.setdefault("turn", index)
        sent_ids = list(request.input_ids)
        with self.timer.phase("generate", timings), prompt_report() as report:
            response = await self._generate(request)
        with self.timer.phase("parse", timings):
            text, parsed = agent.read(response.output_tokens, prepared.model_size)
            token_texts = agent.token_texts(response.output_tokens)
        prompt_ids = list(response.input_tokens) or sent_ids
        server_mismatch = report.mismatch()  # remote engines: what the server built
        turn = TurnRecord(
            index=index,
            observation=screen.observation,
            prompt_ids=prompt_ids,
            output_ids=list(response.output_tokens),
            output_logprobs=[float(x) for x in response.output_logprobs],
            output_versions=[int(v) for v in response.output_versions],
            text=text,
            parsed=parsed,
            stop_reason=response.stop_reason,
            images_in_prompt=len(built.images),
            dropped=dict(built.dropped),
            token_mismatch=prompt_ids != sent_ids or server_mismatch is not None,
            prompt_checked=report.checked > 0,
            timings=timings,
            output_token_texts=token_texts,
        )
        if server_mismatch is not None:
            # the server generated from a prompt the trainer does not have: never trained on
            self.record.turns.append(turn)
            notify(self.observer, "turn_finished", self.context, turn)
            raise InfraFailure(EndReason.TOKEN_MISMATCH, server_mismatch)
        return turn, built.pixels, prepared

    async def _generate(self, request: ModelRequest) -> ModelResponse:
        """``engine.agenerate`` under the turn limit; an aborted or misaligned response is an
        engine failure. A call that failed before answering with a connection error (an
        inference server restart) is sent again, ``recovery.engine_retries`` times, each after
        ``recovery.engine_backoff_s`` (on the episode's clock, inside its time budget); a
        timeout never is. A remote engine's tokens carry the version their request was built
        under (``cua_native.engine.versions``: AReaL 1.0.4 reads it again after the answer)."""
        recovery = self.config.recovery
        retries = 0
        while True:
            try:
                response = await self._generate_once(request)
                break
            except InfraFailure as failure:
                if not isinstance(failure.__cause__, ConnectionError):
                    raise
                if retries >= recovery.engine_retries:
                    raise
                retries += 1
                self.record.engine_retries += 1
                logger.info(
                    "episode %s: model call failed (%s), retry %d of %d",
                    self.context.episode_id,
                    failure,
                    retries,
                    recovery.engine_retries,
                )
                wait = min(recovery.engine_backoff_s, max(0.0, self.deadline.remaining()))
                if wait > 0:
                    waited_from = self.deadline.clock()
                    await asyncio.sleep(wait)
                    self.record.engine_wait_s += self.deadline.clock() - waited_from
        if response.stop_reason == "abort":
            raise InfraFailure(EndReason.GENERATE, "the engine aborted the request")
        n = len(response.output_tokens)
        if len(response.output_logprobs) != n or len(response.output_versions) != n:
            raise InfraFailure(
                EndReason.GENERATE, "engine returned misaligned tokens/logprobs/versions"
            )
        return response

    async def _generate_once(self, request: ModelRequest) -> ModelResponse:
        with served_versions() as served:
            response = await _guarded(
                self.engine.agenerate(request),
                reason=EndReason.GENERATE,
                limit=self.deadline.budget(self.config.turn_timeout_s),
                out_of_time=self.deadline.expired,
                clock=self.deadline.clock,
            )
        response.output_versions = served.pinned(response.output_versions)
        return response


def notify(observer: EpisodeObserver, event: str, *args: Any) -> None:
    """Call an observer hook; an observer failure is logged, never raised into the rollout."""
    try:
        getattr(observer, event)(*args)
    except Exception:
        logger.exception("observer %s failed", event)


async def _guarded(
    call: Awaitable[T],
    *,
    reason: EndReason,
    limit: float,
    out_of_time: Callable[[], bool] | None = None,
    clock: Clock | None = None,
) -> T:
    """Await a gym, builder or engine call under a timeout; failures become
    ``InfraFailure(reason)``. With ``clock``, ``limit`` is measured on it (the episode's
    ``PauseClock``: time the trainer holds the rollout paused does not count).

    A timeout that fires because the episode's own budget ran out (``out_of_time()``) is the
    agent's time limit, not a failing environment: it raises ``_OutOfTime`` instead."""
    try:
        async with asyncio.timeout(limit) if clock is None else clock_timeout(limit, clock):
            return await call
    except TimeoutError as error:
        if out_of_time is not None and out_of_time():
            raise _OutOfTime from error
        raise InfraFailure(reason, f"timed out after {limit:.1f}s") from error
    except (InfraFailure, PromptTooLong):
        raise
    except Exception as error:
        raise InfraFailure(reason, f"{type(error).__name__}: {error}") from error


async def _replays(gym: Gym, limit: float) -> bool:
    """Whether ``gym`` declares exact replay (asked under the call limit; a gym that cannot
    answer is taken not to)."""
    try:
        async with asyncio.timeout(limit):
            return await gym_replays_exactly(gym)
    except Exception as error:
        logger.warning("could not ask gym %s whether it replays exactly: %s", gym.gym_id, error)
        return False


async def _start(gym: Gym, task: Task, limit: float) -> Execution:
    """Create an execution; if cancelled meanwhile, wait (shielded, within ``limit``) for the
    creation and close what came before the cancellation propagates, so that a cancelled
    episode has released its environment when it ends (past ``limit``, or on a second
    cancellation, the close runs when the creation ends)."""
    creating = asyncio.ensure_future(gym.start(task))
    try:
        async with asyncio.timeout(limit):
            return await asyncio.shield(creating)
    except asyncio.CancelledError:
        releasing = asyncio.ensure_future(_release_creation(creating, limit))
        with contextlib.suppress(asyncio.CancelledError):  # cancelled again: it runs on
            await asyncio.shield(releasing)
        raise
    except TimeoutError as error:
        creating.add_done_callback(_close_orphan)
        raise InfraFailure(EndReason.CREATE, f"timed out after {limit:.1f}s") from error
    except Exception as error:
        raise InfraFailure(EndReason.CREATE, f"{type(error).__name__}: {error}") from error


async def _release_creation(creating: asyncio.Future[Execution], limit: float) -> None:
    """Close the execution ``creating`` brings, waiting for it at most ``limit`` (then the
    close is left to the creation's end)."""
    try:
        execution = await asyncio.wait_for(asyncio.shield(creating), limit)
    except TimeoutError:
        creating.add_done_callback(_close_orphan)
        return
    except Exception:  # the creation failed: nothing to close
        return
    await close_execution(execution, limit)


def _close_orphan(creating: asyncio.Future[Execution]) -> None:
    if creating.cancelled() or creating.exception() is not None:
        return
    closing = asyncio.ensure_future(creating.result().close())
    closing.add_done_callback(lambda done: done.cancelled() or done.exception())


async def close_execution(execution: Execution, limit: float) -> None:
    """Close under a timeout, shielded: a cancelled episode still releases its environment
    before the cancellation propagates."""
    closing = asyncio.ensure_future(asyncio.wait_for(execution.close(), limit))
    try:
        await asyncio.shield(closing)
    except asyncio.CancelledError:
        try:
            await asyncio.shield(closing)
        except BaseException:
            logger.warning("close of %s failed during cancellation", execution.execution_id)
        raise
    except Exception:
        logger.exception("close of execution %s failed", execution.execution_id)
