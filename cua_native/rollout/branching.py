"""Branching rollouts: where a group's episodes fork into same-state siblings.

``Brancher`` is one group's ``BranchHook``. After a model turn, before its action is applied,
it decides whether to branch there (``BranchConfig.trigger``): on a ``schedule`` of turn
indices (root episodes only), or where the policy was ``uncertain`` of the action: the
surprisal ``-log p`` of the action's first ``action_tokens`` sampled tokens (the log-prob of
that prefix, a one-sample estimate of its entropy). Branching forks the execution ``children - 1`` times
(``gym.protocol.fork_execution``: a gym that cannot fork raises ``ForkUnsupported``, which is
never caught here: no silent fallback) and starts one sibling episode on each copy; the
episode's own turn is the remaining sibling. ``max_points`` bounds the branch points of the
group; a sibling never branches again at the turn it started on (that is its parent's set),
and a root never at its first turn (the group's roots are that turn's siblings already).
Extra environment steps (the siblings' turns) are counted for the step table. A sibling is
never retried (its state cannot be created afresh): one rejected for infrastructure rejects
the group, as a root rejected twice does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from cua_native.gym.protocol import Execution, fork_execution
from cua_native.rollout.config import BranchConfig
from cua_native.rollout.episode import Episode, EpisodeRun
from cua_native.rollout.records import EpisodeContext, TurnRecord

ACTION_MARKERS = ('"action"', "<tool_call>")
"""Where an output's action begins (its first tokens after the first of these that occurs);
an output with neither is scored from its first token."""


def action_start(token_texts: list[str]) -> int:
    """The index of the first token after the first ``ACTION_MARKERS`` match (by the decoded
    text of the tokens before it), or 0."""
    for marker in ACTION_MARKERS:
        text = ""
        for i, piece in enumerate(token_texts):
            text += piece
            if marker in text:
                return i + 1
    return 0


def action_surprisal(turn: TurnRecord, tokens: int) -> float:
    """``-log p`` of the first ``tokens`` sampled tokens of the turn's action, summed (of the
    output's first tokens when no action marker is found or nothing follows it)."""
    logprobs = turn.output_logprobs
    start = action_start(turn.output_token_texts)
    window = logprobs[start : start + tokens] or logprobs[:tokens]
    return -sum(window)


@dataclass(slots=True)
class BranchTally:
    """What branching did in one group: branch points and the siblings' environment steps."""

    points: int = 0
    siblings: int = 0
    extra_turns: int = 0


@dataclass(slots=True)
class Brancher:
    """One group's branch hook. ``spawn`` schedules a sibling's run (the group runner awaits
    it with the others); ``make_context`` gives a sibling its context from the parent's."""

    config: BranchConfig
    spawn: Callable[[Episode], None]
    make_context: Callable[[EpisodeContext, int], EpisodeContext]
    fork_timeout_s: float = 120.0
    tally: BranchTally = field(default_factory=BranchTally)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def wants(self, episode: Episode, index: int, turn: TurnRecord) -> bool:
        """Whether ``episode`` branches at turn ``index`` (budget aside)."""
        record = episode.record
        if record.origin is not None and record.origin.turn == index:
            return False  # its siblings at this turn are its parent's set already
        if record.origin is None and index == 0:
            return False  # the roots' first turns are the group: same state already
        if self.config.trigger == "schedule":
            return record.origin is None and index in self.config.turns
        return action_surprisal(turn, self.config.action_tokens) >= self.config.threshold

    async def after_model_turn(self, episode: Episode, index: int, turn: TurnRecord) -> None:
        if not self.wants(episode, index, turn):
            return
        async with self._lock:  # the budget is the group's
            if self.tally.points >= self.config.max_points:
                return
            self.tally.points += 1
        assert episode.execution is not None
        forks: list[Execution] = []
        try:
            for _ in range(self.config.children - 1):
                async with asyncio.timeout(self.fork_timeout_s):
                    forks.append(await fork_execution(episode.execution))
        except BaseException:
            for copy in forks:  # nobody else owns them yet
                await copy.close()
            raise
        episode.record.branched_at.append(index)
        for copy in forks:
            self.tally.siblings += 1
            self.spawn(episode.sibling(copy, index, self.make_context(episode.context, index)))

    def count(self, run: EpisodeRun) -> None:
        """Add a finished sibling's turns to the extra environment steps."""
        if run.record.origin is not None:
            self.tally.extra_turns += len(run.record.turns)
