"""What is counted of an episode: ``EpisodeRecord.figures`` and the tallies that read it (the
``EpisodeTally`` of summaries and evaluations, the workflow's per-episode AReaL stats)."""

from __future__ import annotations

import pytest
from areal.utils.stats_tracker import DistributedStatsTracker
from PIL import Image

from cua_native.actions.errors import ParsedOutput, failure
from cua_native.actions.models import Action, Click, Terminate
from cua_native.gym.protocol import Observation, Screenshot, Task
from cua_native.rollout.episode import EpisodeRun
from cua_native.rollout.records import (
    EndReason,
    EpisodeContext,
    EpisodeFigures,
    EpisodeRecord,
    EpisodeTally,
    TurnRecord,
    claimed_done,
)
from cua_native.rollout.workflow import record_group_stats


def _turn(
    index: int, *, ok: bool = True, mismatch: bool = False, action: Action | None = None
) -> TurnRecord:
    return TurnRecord(
        index=index,
        observation=Observation(Screenshot(image=Image.new("RGB", (4, 4))), 4, 4, index),
        prompt_ids=[1, 2],
        output_ids=[3],
        output_logprobs=[-0.5],
        output_versions=[0],
        text="x",
        parsed=ParsedOutput(action=action or Click(x=0.1, y=0.2))
        if ok
        else failure("tool_arg", "bad x"),
        token_mismatch=mismatch,
    )


def _record(reward: float, success: bool, turns: list[TurnRecord]) -> EpisodeRecord:
    return EpisodeRecord(
        context=EpisodeContext(task=Task(task_id="t")),
        turns=turns,
        reward=reward,
        success=success,
        end_reason=EndReason.TERMINATE,
    )


def _episodes() -> list[EpisodeRecord]:
    solved = _record(0.95, True, [_turn(0, mismatch=True), _turn(1, ok=False)])
    failed = _record(0.0, False, [_turn(0)])
    rejected = _record(0.0, False, [_turn(0, ok=False)])
    rejected.outcome, rejected.reject_reason = "rejected", EndReason.ACT
    return [solved, failed, rejected]


def test_figures_count_the_turns_once() -> None:
    solved = _episodes()[0]
    assert solved.figures() == EpisodeFigures(
        reward=0.95,
        success=True,
        turns=2,
        parse_errors={"format": 0, "tool_name": 0, "tool_arg": 1},
        token_mismatches=1,
        prompt_checks=0,
    )


def test_tally_adds_the_figures_of_completed_episodes() -> None:
    tally = EpisodeTally()
    for record in _episodes():
        tally.episode_finished(record)
    assert (tally.completed, tally.rejected, tally.episodes) == (2, 1, 3)
    assert tally.reject_reasons == {"act": 1}
    assert (tally.successes, tally.success_rate) == (1, 0.5)
    assert tally.rewards == [0.95, 0.0] and tally.turns == [2, 1]
    assert tally.parse_errors == {"format": 0, "tool_name": 0, "tool_arg": 1}
    assert tally.token_mismatches == 1
    assert tally.turns_mean == 1.5


def test_group_stats_report_the_same_figures_through_areal() -> None:
    tracker = DistributedStatsTracker()
    runs = [EpisodeRun(record=r) for r in _episodes()[:2]]
    record_group_stats(tracker, runs)
    stats = tracker.export()
    assert stats["cua/success"] == pytest.approx(0.5)
    assert stats["cua/reward"] == pytest.approx(0.475)
    assert stats["cua/turns"] == pytest.approx(1.5)
    assert stats["cua/token_mismatches"] == pytest.approx(0.5)
    assert stats["cua/parse_errors/tool_arg"] == pytest.approx(0.5)
    assert stats["cua/parse_errors/format"] == 0.0
    assert stats["cua/end/terminate"] == 1.0


def test_a_failed_done_is_a_terminate_success_the_gym_failed() -> None:
    done = _turn(1, action=Terminate(status="success"))
    gave_up = _turn(1, action=Terminate(status="failure"))
    false_done = _record(0.0, False, [_turn(0), done])
    true_done = _record(1.0, True, [_turn(0), done])
    admitted = _record(0.0, False, [_turn(0), gave_up])
    out_of_turns = _record(0.0, False, [_turn(0), done])
    out_of_turns.end_reason = EndReason.MAX_TURNS
    assert [claimed_done(r) for r in (false_done, true_done, admitted, out_of_turns)] == [
        True,
        True,
        False,
        False,
    ]
    tally = EpisodeTally()
    for record in (false_done, true_done, admitted, out_of_turns):
        tally.episode_finished(record)
    assert tally.false_done == 1 and tally.false_done_rate == 0.25
    assert EpisodeTally().false_done_rate == 0.0
