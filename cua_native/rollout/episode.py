"""One episode: observe → prompt → generate → parse → act, until the agent stops or runs out.

``run_episode`` never raises for environment or engine trouble: infrastructure failures come
back as a ``rejected`` record (the workflow retries them with a fresh execution); agent failures
(unparseable output, out of turns or time, a wrong answer) are ``completed`` records with their
reward. The execution is closed on every path, cancellation included.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest, ModelResponse

from cua_native.actions.dialects import Dialect
from cua_native.actions.errors import ParsedOutput
from cua_native.actions.models import Answer, Terminate
from cua_native.gym.protocol import Evaluation, Execution, Gym, Observation, StepResult, Task
from cua_native.prompts import HistoryStep, PromptTooLong
from cua_native.prompts.pixels import PromptPixels
from cua_native.rollout.config import AgentConfig
from cua_native.rollout.cpu_pool import WORK_RANK
from cua_native.rollout.pause_clock import clock_timeout
from cua_native.rollout.records import (
    EpisodeContext,
    EpisodeObserver,
    EpisodeRecord,
    Phase,
    TurnRecord,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Engine(Protocol):
    """The part of AReaL's ``InferenceEngine`` the loop uses."""

    async def agenerate(self, req: ModelRequest) -> ModelResponse: ...


class InfraFailure(Exception):
    """The environment or the engine failed; the episode cannot be trained on."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(slots=True)
class EpisodeRun:
    """An episode's record plus, per turn, the image tensors of its prompt (by reference:
    ``PromptPixels.tensors()`` concatenates them when the training row is built)."""

    record: EpisodeRecord
    prompt_pixels: list[PromptPixels] = field(default_factory=list)

    @property
    def rejected(self) -> bool:
        return self.record.outcome == "rejected"


@dataclass(frozen=True, slots=True)
class Turnkit:
    """What an episode needs besides the gym and the engine (shared by concurrent episodes)."""

    builder: Any
    """A ``cua_native.prompts.PromptBuilder``."""
    dialect: Dialect
    tokenizer: Any
    gconfig: GenerationHyperparameters
    config: AgentConfig
    token_texts: TokenTexts = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_texts", TokenTexts(self.tokenizer))


class _Clock:
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


def notify(observer: EpisodeObserver, event: str, *args: Any) -> None:
    """Call an observer hook; an observer failure is logged, never raised into the rollout."""
    try:
        getattr(observer, event)(*args)
    except Exception:
        logger.exception("observer %s failed", event)


async def _guarded(
    call: Awaitable[T],
    *,
    reason: str,
    limit: float,
    out_of_time: Callable[[], bool] | None = None,
) -> T:
    """Await a gym or builder call under a timeout; failures become ``InfraFailure(reason)``.

    A timeout that fires because the episode's own budget ran out (``out_of_time()``) is the
    agent's time limit, not a failing environment: it raises ``_OutOfTime`` instead."""
    try:
        async with asyncio.timeout(limit):
            return await call
    except TimeoutError as error:
        if out_of_time is not None and out_of_time():
            raise _OutOfTime from error
        raise InfraFailure(reason, f"timed out after {limit:.1f}s") from error
    except (InfraFailure, PromptTooLong):
        raise
    except Exception as error:
        raise InfraFailure(reason, f"{type(error).__name__}: {error}") from error


async def _start(gym: Gym, task: Task, limit: float) -> Execution:
    """Create an execution; if cancelled meanwhile, wait for the creation and close what came."""
    creating = asyncio.ensure_future(gym.start(task))
    try:
        async with asyncio.timeout(limit):
            return await asyncio.shield(creating)
    except asyncio.CancelledError:
        creating.add_done_callback(_close_orphan)
        raise
    except TimeoutError as error:
        creating.add_done_callback(_close_orphan)
        raise InfraFailure("create", f"timed out after {limit:.1f}s") from error
    except Exception as error:
        raise InfraFailure("create", f"{type(error).__name__}: {error}") from error


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


def decode_output(tokenizer: Any, output_ids: list[int], stop_ids: list[int]) -> str:
    """The model's text: the output without its final stop token."""
    ids = output_ids[:-1] if output_ids and output_ids[-1] in stop_ids else output_ids
    return tokenizer.decode(ids, skip_special_tokens=False)


def token_texts_of(tokenizer: Any, token_ids: list[int]) -> list[str]:
    """Each token decoded on its own (what the monitor shows next to its log-prob); through the
    Rust backend in one call when the tokenizer has one (HF's ``batch_decode`` pays Python
    overhead per token, on the event loop). HF's own path is kept for tokenizers that clean up
    spaces after decoding, which the backend does not do."""
    singles = [[t] for t in token_ids]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return list(backend.decode_batch(singles, skip_special_tokens=False))
    return list(tokenizer.batch_decode(singles))


class TokenTexts:
    """``token_texts_of`` with each id's text decoded once (a vocabulary's worth at most)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token_ids: list[int]) -> list[str]:
        texts = self._texts
        missing = [t for t in dict.fromkeys(token_ids) if t not in texts]
        if missing:
            # Concurrent callers may decode the same id; the text is the same.
            texts.update(zip(missing, token_texts_of(self.tokenizer, missing), strict=True))
        return [texts[t] for t in token_ids]


def feedback_for(parsed: ParsedOutput, step: StepResult | None) -> str | None:
    """What the model is told about its last turn at the start of the next one."""
    if parsed.error is not None:
        return f"Your last output could not be parsed ({parsed.error.kind}): {parsed.error.message}"
    if step is None:
        return None
    if not step.ok:
        return f"The action failed: {step.error or 'refused by the environment'}"
    return step.feedback


async def run_episode(
    *,
    gym: Gym,
    task: Task,
    engine: Engine,
    kit: Turnkit,
    context: EpisodeContext,
    observer: EpisodeObserver,
    clock: Callable[[], float] = time.monotonic,
) -> EpisodeRun:
    """Run one episode of ``task`` on a fresh execution of ``gym`` and return its record."""
    config = kit.config
    record = EpisodeRecord(context=context)
    run = EpisodeRun(record=record)
    timer = _Clock(record.timings)
    deadline = clock() + config.episode_timeout_s
    execution: Execution | None = None
    started = time.monotonic()
    # The CPU pool's order for this episode's work (``cpu_pool``); _loop moves it per turn.
    rank = WORK_RANK.set((0, started))
    notify(observer, "episode_started", context)
    try:
        with timer.phase("create"):
            execution = await _start(gym, task, config.turn_timeout_s)
        context.execution_id = execution.execution_id
        await _loop(execution, engine, kit, run, observer, timer, deadline, clock, started)
        with timer.phase("evaluate"):
            evaluation: Evaluation = await _guarded(
                execution.evaluate(record.answer),
                reason="evaluate",
                limit=config.turn_timeout_s,
            )
        record.evaluation = evaluation
        record.success = evaluation.success
        record.reward = evaluation.reward - config.format_penalty * sum(
            record.parse_errors.values()
        )
    except InfraFailure as failure:
        record.outcome = "rejected"
        record.reject_reason = failure.reason
        record.end_reason = failure.reason
        logger.warning("episode %s rejected: %s", context.episode_id, failure)
    finally:
        try:
            if execution is not None:
                with timer.phase("close"):
                    await close_execution(execution, config.close_timeout_s)
        finally:
            WORK_RANK.reset(rank)
    notify(observer, "episode_finished", record)
    return run


async def _loop(
    execution: Execution,
    engine: Engine,
    kit: Turnkit,
    run: EpisodeRun,
    observer: EpisodeObserver,
    timer: _Clock,
    deadline: float,
    clock: Callable[[], float],
    started: float,
) -> None:
    config = kit.config
    record = run.record
    history: list[HistoryStep] = []
    consecutive_errors = 0
    observation: Observation | None = None
    cached: tuple[Observation, Any] | None = None
    # The last observation's prepared image: a parse-error turn shows the same screen again.
    for index in range(config.max_turns):
        WORK_RANK.set((index, started))  # reset by run_episode
        remaining = deadline - clock()
        if remaining <= 0:
            record.end_reason = "time_limit"
            return
        timings: dict[str, float] = {}
        try:
            if observation is None:
                with timer.phase("observe", timings):
                    observation = await _guarded(
                        execution.observe(),
                        reason="observe",
                        limit=min(config.turn_timeout_s, remaining),
                        out_of_time=lambda: expired(deadline, clock),
                    )
            reuse = cached[1] if cached is not None and cached[0] is observation else None
            turn, pixels, prepared = await _model_turn(
                index,
                observation,
                reuse,
                history,
                engine,
                kit,
                run,
                timer,
                timings,
                deadline,
                clock,
            )
            cached = (observation, prepared)
        except _OutOfTime:
            record.end_reason = "time_limit"
            return
        except PromptTooLong:
            # Even the minimal prompt overflows the context: the agent's episode ends here.
            record.end_reason = "context_limit"
            return
        record.turns.append(turn)
        run.prompt_pixels.append(pixels)
        parsed = turn.parsed
        consecutive_errors = consecutive_errors + 1 if parsed.error is not None else 0
        action = parsed.action if parsed.error is None else None
        if isinstance(action, Answer | Terminate):
            record.answer = action.text if isinstance(action, Answer) else None
            record.end_reason = "answer" if isinstance(action, Answer) else "terminate"
            notify(observer, "turn_finished", record.context, turn)
            return
        if action is not None:
            with timer.phase("act", timings):
                turn.step = await _guarded(
                    execution.act(action), reason="act", limit=config.turn_timeout_s
                )
            # The act's own observation saves a call; without one the next turn observes.
            observation = turn.step.observation
        history.append(
            HistoryStep(
                screenshot=prepared,
                parsed=parsed,
                raw_text=turn.text,
                feedback=feedback_for(parsed, turn.step),
            )
        )
        notify(observer, "turn_finished", record.context, turn)
        if consecutive_errors >= config.max_consecutive_parse_errors:
            record.end_reason = "parse_errors"
            return
    record.end_reason = "max_turns"


DEADLINE_SLACK_S = 0.05
"""A timeout this close to the episode deadline is the deadline: the event loop may fire a
timer a little early, and its clock is not the one the deadline was taken from."""


def expired(deadline: float, clock: Callable[[], float]) -> bool:
    """Whether the episode's time budget has run out (within ``DEADLINE_SLACK_S``)."""
    return deadline - clock() <= DEADLINE_SLACK_S


class _OutOfTime(Exception):
    """The episode's time budget ran out inside a turn."""


async def _model_turn(
    index: int,
    observation: Observation,
    prepared: Any,
    history: list[HistoryStep],
    engine: Engine,
    kit: Turnkit,
    run: EpisodeRun,
    timer: _Clock,
    timings: dict[str, float],
    deadline: float,
    clock: Callable[[], float],
) -> tuple[TurnRecord, PromptPixels, Any]:
    """Prompt, generate and parse one turn: the turn, its prompt's multimodal input, and the
    prepared screenshot (for the history)."""
    config = kit.config

    def budget() -> float:
        remaining = deadline - clock()
        if remaining <= 0:
            raise _OutOfTime
        return min(config.turn_timeout_s, remaining)

    def out_of_time() -> bool:
        return expired(deadline, clock)

    with timer.phase("prompt", timings):
        built = await _guarded(
            kit.builder.build_turn(
                run.record.context.task,
                list(history),
                prepared if prepared is not None else observation.screenshot,
                kit.gconfig,
            ),
            reason="prompt",
            limit=budget(),
            out_of_time=out_of_time,
        )
    prepared = built.current
    request: ModelRequest = built.request
    # Identity for engines and traces (AReaL's engines ignore unknown metadata keys).
    request.metadata.setdefault("episode_id", run.record.context.episode_id)
    request.metadata.setdefault("turn", index)
    sent_ids = list(request.input_ids)
    with timer.phase("generate", timings):
        response = await _generate(engine, request, budget(), deadline, clock)
    with timer.phase("parse", timings):
        stop_ids = list(kit.gconfig.stop_token_ids)
        text = decode_output(kit.tokenizer, response.output_tokens, stop_ids)
        parsed = kit.dialect.parse(text, image_size=prepared.model_size)
        token_texts = kit.token_texts(response.output_tokens)
    prompt_ids = list(response.input_tokens) or sent_ids
    turn = TurnRecord(
        index=index,
        observation=observation,
        prompt_ids=prompt_ids,
        output_ids=list(response.output_tokens),
        output_logprobs=[float(x) for x in response.output_logprobs],
        output_versions=[int(v) for v in response.output_versions],
        text=text,
        parsed=parsed,
        stop_reason=response.stop_reason,
        images_in_prompt=len(built.images),
        dropped=dict(built.dropped),
        token_mismatch=prompt_ids != sent_ids,
        timings=timings,
        output_token_texts=token_texts,
    )
    return turn, built.pixels, prepared


async def _generate(
    engine: Engine,
    request: ModelRequest,
    limit: float,
    deadline: float,
    clock: Callable[[], float],
) -> ModelResponse:
    """``engine.agenerate`` under the turn limit: the episode budget running out is the agent's
    time limit; any other timeout, error or abort is an engine failure."""
    try:
        # on the episode's clock: time the trainer holds the rollout paused does not count
        async with clock_timeout(limit, clock):
            response = await engine.agenerate(request)
    except TimeoutError as error:
        if expired(deadline, clock):
            raise _OutOfTime from error
        raise InfraFailure("generate", f"timed out after {limit:.1f}s") from error
    except Exception as error:
        raise InfraFailure("generate", f"{type(error).__name__}: {error}") from error
    if response.stop_reason == "abort":
        raise InfraFailure("generate", "the engine aborted the request")
    if len(response.output_logprobs) != len(response.output_tokens) or len(
        response.output_versions
    ) != len(response.output_tokens):
        raise InfraFailure("generate", "engine returned misaligned tokens/logprobs/versions")
    return response


async def run_with_retry(
    *,
    gym: Gym,
    task: Task,
    engine: Engine,
    kit: Turnkit,
    make_context: Callable[[int], EpisodeContext],
    observer: EpisodeObserver,
    on_reject: Callable[[EpisodeRun], None] = lambda run: None,
    clock: Callable[[], float] = time.monotonic,
) -> EpisodeRun:
    """Run an episode; an infrastructure rejection is retried on a fresh execution up to
    ``config.infra_retries`` times. Returns the last run (``rejected`` if every attempt was).
    ``clock``: the episode's time (``PauseClock`` excludes the trainer's pauses)."""
    attempt = 0
    while True:
        run = await run_episode(
            gym=gym,
            task=task,
            engine=engine,
            kit=kit,
            context=make_context(attempt),
            observer=observer,
            clock=clock,
        )
        if not run.rejected:
            return run
        on_reject(run)
        if attempt >= kit.config.infra_retries:
            return run
        attempt += 1
