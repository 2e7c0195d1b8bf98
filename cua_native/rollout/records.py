"""What an episode produces: the records shared by the workflow, the trainer and the monitor.

The workflow fills these while it runs and hands them to an ``EpisodeObserver`` (the monitor's
recorder) at three points: episode start, each finished turn, episode end. Observers must return
at once and never raise into the rollout.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Protocol

from cua_native.actions.errors import ERROR_KINDS, ParsedOutput
from cua_native.actions.models import Terminate
from cua_native.gym.protocol import Evaluation, Observation, StepResult, Task

Phase = Literal["create", "observe", "prompt", "generate", "parse", "act", "evaluate", "close"]


class EndReason(StrEnum):
    """How an episode ended. The agent's endings come first; the rest name the phase whose
    infrastructure failure rejected the episode (also its ``reject_reason``)."""

    ANSWER = "answer"
    TERMINATE = "terminate"
    MAX_TURNS = "max_turns"
    TIME_LIMIT = "time_limit"
    PARSE_ERRORS = "parse_errors"
    CONTEXT_LIMIT = "context_limit"
    """Even the smallest prompt the builder can make overflows the model's context."""
    CREATE = "create"
    OBSERVE = "observe"
    PROMPT = "prompt"
    GENERATE = "generate"
    ACT = "act"
    EVALUATE = "evaluate"
    BAD_REWARD = "bad_reward"
    """The gym's reward is not a finite number."""
    TOKEN_MISMATCH = "token_mismatch"
    """A remote server reports another prompt than the builder's ids (count, or ids where it
    returns them): it generated from ids the trainer does not have."""


EpisodeOutcome = Literal["completed", "rejected"]
"""``completed``: a real sample with its reward (success or agent failure).
``rejected``: infrastructure failed; the episode must not be trained on."""


@dataclass(slots=True)
class TurnRecord:
    """One model call and the action it led to."""

    index: int
    observation: Observation
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    text: str
    parsed: ParsedOutput
    stop_reason: str | None = None
    step: StepResult | None = None
    images_in_prompt: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    """What the prompt builder dropped to fit the budget (e.g. ``{"images": 2, "turns": 0}``)."""
    token_mismatch: bool = False
    """The engine reported other prompt ids than were sent (the engine's ids were kept), or a
    remote server reported another prompt (the episode is then rejected as ``token_mismatch``)."""
    prompt_checked: bool = False
    """A remote server reported the prompt it built and it was compared with the ids sent."""
    timings: dict[str, float] = field(default_factory=dict)
    reward: float = 0.0
    """Reward attributed to this turn (after discounting and shaping)."""
    output_token_texts: list[str] = field(default_factory=list)
    """Each output token decoded on its own (what the monitor shows next to its log-prob)."""


@dataclass(slots=True)
class EpisodeContext:
    """Identity of one episode, passed to observers on every event."""

    task: Task
    group_id: str = ""
    episode_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    execution_id: str | None = None
    attempt: int = 0
    source: Literal["step", "eval", "baseline"] = "step"
    """What the rollout belongs to (monitor ``source_type``)."""
    step: int | None = None
    """The training step (``source == "step"``) or eval/baseline ordinal."""
    model_version: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BranchOrigin:
    """Where a branched episode came from: its parent episode and the turn index at which the
    parent's execution was forked (the child's first own turn; the parent's turns before it
    are the child's history)."""

    parent_id: str
    turn: int


@dataclass(slots=True)
class EpisodeRecord:
    context: EpisodeContext
    turns: list[TurnRecord] = field(default_factory=list)
    outcome: EpisodeOutcome = "completed"
    reject_reason: EndReason | None = None
    evaluation: Evaluation | None = None
    reward: float = 0.0
    success: bool = False
    answer: str | None = None
    """What ``evaluate`` was given: ``protocol.final_answer`` of the final action."""
    end_reason: EndReason | None = None
    """Set when the episode ends (``None`` while it runs)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Total seconds per phase over the episode."""
    origin: BranchOrigin | None = None
    """Set on an episode forked from another (branching rollouts); ``None`` for a root."""
    branched_at: list[int] = field(default_factory=list)
    """Turn indices at which this episode's execution was forked into siblings."""
    replayed: bool = False
    """A stored success mixed into a later group (success replay): trained, not played again."""
    lost_executions: list[str] = field(default_factory=list)
    """Executions lost mid-episode and restored by exact replay on a fresh one
    (``gym/recovery.py``); ``context.execution_id`` is the one the episode ended on."""
    replayed_actions: int = 0
    """Actions replayed to restore them."""
    recovery_s: float = 0.0
    """Seconds spent restoring them."""
    engine_retries: int = 0
    """Model calls sent again after failing before an answer."""
    engine_wait_s: float = 0.0
    """Seconds waited before those retries."""

    @property
    def recovered_calls(self) -> int:
        """Calls that failed and were recovered at the call: restores and model retries."""
        return len(self.lost_executions) + self.engine_retries

    @property
    def parse_errors(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for turn in self.turns:
            if turn.parsed.error is not None:
                counts[turn.parsed.error.kind] = counts.get(turn.parsed.error.kind, 0) + 1
        return counts

    def figures(self) -> EpisodeFigures:
        """What is counted of this episode (see ``EpisodeFigures``)."""
        errors: dict[str, int] = dict.fromkeys(ERROR_KINDS, 0)
        errors.update(self.parse_errors)
        return EpisodeFigures(
            reward=self.reward,
            success=self.success,
            turns=len(self.turns),
            parse_errors=errors,
            token_mismatches=sum(turn.token_mismatch for turn in self.turns),
            prompt_checks=sum(turn.prompt_checked for turn in self.turns),
        )


@dataclass(frozen=True, slots=True)
class EpisodeFigures:
    """The figures of one episode that everything reporting episodes counts: ``EpisodeTally``
    (step summaries, evaluations, ``evaluate``), the workflow's per-episode AReaL stats and the
    monitor's rollout row all read them here instead of recounting the turns."""

    reward: float
    success: bool
    turns: int
    parse_errors: dict[str, int]
    """Parse errors by kind: every kind of ``ERROR_KINDS`` (0 when none)."""
    token_mismatches: int
    prompt_checks: int
    """Turns whose prompt a remote inference server reported back and that were compared."""


class EpisodeObserver(Protocol):
    """Receives episode events. Implementations return at once and never raise."""

    def episode_started(self, context: EpisodeContext) -> None: ...

    def turn_finished(self, context: EpisodeContext, turn: TurnRecord) -> None: ...

    def episode_finished(self, record: EpisodeRecord) -> None: ...


class NullObserver:
    """Records nothing; a base for observers that only need some of the hooks."""

    __slots__ = ()

    def episode_started(self, context: EpisodeContext) -> None:
        return None

    def turn_finished(self, context: EpisodeContext, turn: TurnRecord) -> None:
        return None

    def episode_finished(self, record: EpisodeRecord) -> None:
        return None


class FanoutObserver:
    """Passes every event to several observers; one that raises is logged and skipped."""

    def __init__(self, *observers: EpisodeObserver) -> None:
        self.observers = observers

    def _each(self, method: str, *args: Any) -> None:
        for observer in self.observers:
            try:
                getattr(observer, method)(*args)
            except Exception:  # an observer must never break a rollout
                logging.getLogger(__name__).exception("observer %r failed on %s", observer, method)

    def episode_started(self, context: EpisodeContext) -> None:
        self._each("episode_started", context)

    def turn_finished(self, context: EpisodeContext, turn: TurnRecord) -> None:
        self._each("turn_finished", context, turn)

    def episode_finished(self, record: EpisodeRecord) -> None:
        self._each("episode_finished", record)


def claimed_done(record: EpisodeRecord) -> bool:
    """The agent ended ``record`` by declaring success (its last turn, ``terminate(success)``)."""
    if record.end_reason != EndReason.TERMINATE or not record.turns:
        return False
    action = record.turns[-1].parsed.action
    return isinstance(action, Terminate) and action.status == "success"


@dataclass(slots=True)
class EpisodeTally(NullObserver):
    """Counts finished episodes: the one tally of step summaries, evaluations and the
    ``evaluate`` command (an observer, or fed with ``episode_finished(record)``)."""

    completed: int = 0
    rejected: int = 0
    successes: int = 0
    rewards: list[float] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    parse_errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_KINDS, 0))
    token_mismatches: int = 0
    reject_reasons: dict[str, int] = field(default_factory=dict)
    false_done: int = 0
    """Completed episodes the agent ended with ``terminate(success)`` that the gym's evaluation
    failed: a premature or mistaken "done"."""
    restored: int = 0
    """Executions lost and restored by replay (every episode, rejected ones included)."""
    recovered_episodes: int = 0
    """Completed episodes that recovered at least one call (a restore or a model retry)."""
    engine_retries: int = 0
    recovery_s: float = 0.0
    """Seconds spent restoring executions and waiting before model retries."""

    def episode_finished(self, record: EpisodeRecord) -> None:
        self.restored += len(record.lost_executions)
        self.engine_retries += record.engine_retries
        self.recovery_s += record.recovery_s + record.engine_wait_s
        if record.outcome == "rejected":
            self.rejected += 1
            reason = str(record.reject_reason or "unknown")
            self.reject_reasons[reason] = self.reject_reasons.get(reason, 0) + 1
            return
        figures = record.figures()
        self.completed += 1
        self.recovered_episodes += int(record.recovered_calls > 0)
        self.token_mismatches += figures.token_mismatches
        self.successes += int(figures.success)
        self.rewards.append(figures.reward)
        self.turns.append(figures.turns)
        self.false_done += int(claimed_done(record) and not figures.success)
        for kind, n in figures.parse_errors.items():
            self.parse_errors[kind] = self.parse_errors.get(kind, 0) + n

    @property
    def success_rate(self) -> float:
        return self.successes / self.completed if self.completed else 0.0

    @property
    def false_done_rate(self) -> float:
        """Share of completed episodes that ended in a ``terminate(success)`` that failed."""
        return self.false_done / self.completed if self.completed else 0.0

    @property
    def episodes(self) -> int:
        return self.completed + self.rejected

    @property
    def reward_mean(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0

    @property
    def reward_std(self) -> float:
        """Unbiased standard deviation of the completed episodes' rewards (0 for fewer than 2)."""
        n = len(self.rewards)
        if n < 2:
            return 0.0
        mean = self.reward_mean
        return float((sum((r - mean) ** 2 for r in self.rewards) / (n - 1)) ** 0.5)

    @property
    def turns_mean(self) -> float:
        return sum(self.turns) / len(self.turns) if self.turns else 0.0
