"""The final report: evaluation points with intervals, the paired gain, evals.json, the PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cua_native.rollout.records import EpisodeTally
from cua_native.training.embedded.evaluation import EvalResult
from cua_native.training.embedded.report import eval_points, gain, print_report
from cua_native.training.embedded.trainer import StepSummary, TrainReport, _eval_due


def _report(tmp_path: Path) -> TrainReport:
    report = TrainReport(run_dir=tmp_path, model_dir=tmp_path, monitor_url=None)
    report.steps = [
        StepSummary(
            step=i,
            episodes=16,
            rejected_groups=0,
            success_rate=0.1 * i,
            reward_mean=0.1 * i,
            reward_std=0.2,
            turns_mean=3.0,
            samples=40,
        )
        for i in range(4)
    ]
    tasks = [f"sim-{i:03d}" for i in range(1, 13)]
    for step, first, parse_errors, false_done in (
        (-1, False, 4, 12),
        (1, True, 2, 6),
        (3, True, 1, 0),
    ):
        outcomes = {t: [step == 3, first, False, i % 3 == 0] for i, t in enumerate(tasks)}
        report.evaluations[step] = _result(step, outcomes, parse_errors, false_done)
    return report


def _result(
    step: int, outcomes: dict[str, list[bool]], parse_errors: int, false_done: int
) -> EvalResult:
    """An evaluation of 48 episodes and 10 model turns: ``parse_errors`` of the turns
    unparseable, ``false_done`` episodes ended in a failed done."""
    total = EpisodeTally(
        completed=48,
        successes=sum(sum(v) for v in outcomes.values()),
        turns=[1] * 10,
        parse_errors={"format": parse_errors, "tool_name": 0, "tool_arg": 0},
        false_done=false_done,
    )
    kind = "baseline" if step < 0 else "eval"
    return EvalResult(kind, max(step, 0), total, {}, outcomes)


def test_gain_is_last_eval_minus_baseline_on_the_same_tasks(tmp_path: Path) -> None:
    report = _report(tmp_path)
    found = gain(report)
    assert found is not None
    assert found.baseline == pytest.approx(4 / 48) and found.final == pytest.approx(28 / 48)
    assert found.step == 3 and found.tasks == 12 and found.episodes == 48
    assert found.difference.estimate == pytest.approx(0.5)
    assert found.difference.excludes_zero()
    assert [p.step for p in eval_points(report)] == [-1, 1, 3]


def test_no_gain_without_a_baseline(tmp_path: Path) -> None:
    report = _report(tmp_path)
    del report.evaluations[-1]
    assert gain(report) is None


def test_print_report_shows_the_gain_and_writes_evals_and_curve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    print_report(_report(tmp_path))
    out = capsys.readouterr().out
    assert "baseline:" in out and "eval after step 3:" in out
    assert "gain (last eval - baseline): 8% -> 58% = +50.0%, paired 95% CI over 12 tasks" in out
    assert "10% of turns unparseable" in out
    assert "40% of turns unparseable, 25% ended in a failed done" in out
    data = json.loads((tmp_path / "evals.json").read_text())
    assert data["gain"]["difference"] == pytest.approx(0.5)
    assert [p["step"] for p in data["points"]] == [-1, 1, 3]
    assert [p["false_done"] for p in data["points"]] == [0.25, 0.125, 0.0]
    assert (tmp_path / "reward_curve.png").stat().st_size > 0
    # no local monitor database (cua.monitor_db=null): no dashboard command for it
    assert "dashboard:       none here (cua.monitor_db=null" in out and "monitor serve" not in out


def test_print_report_names_the_dashboard_of_the_monitor_it_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _report(tmp_path)
    report.monitor_url = f"sqlite:///{tmp_path / 'monitor.db'}"
    print_report(report)
    out = capsys.readouterr().out
    assert f"monitor db:      {report.monitor_url}" in out
    assert f"monitor serve --db {report.monitor_url} --run-dir {tmp_path}" in out


def test_the_last_step_is_always_evaluated() -> None:
    assert [s for s in range(10) if _eval_due(4, s, 10)] == [3, 7, 9]
    assert [s for s in range(8) if _eval_due(4, s, 8)] == [3, 7]
    assert not any(_eval_due(0, s, 8) for s in range(8))


def test_the_step_table_shows_faults_retries_recovered_calls_and_time_lost() -> None:
    from cua_native.training.embedded.trainer import step_table_header

    summary = StepSummary(
        step=2,
        episodes=16,
        rejected_groups=1,
        success_rate=0.5,
        reward_mean=0.5,
        reward_std=0.2,
        turns_mean=3.0,
        samples=40,
        seconds=100.0,
        rollout_seconds=60.0,
        rejected_episodes=3,
        retries=7,
        retry_wait_s=4.0,
        restored=2,
        engine_retries=1,
        recovery_s=8.0,
    )
    header, row = step_table_header().split(), summary.table_row().split()
    assert header[-6:] == ["roll", "rej", "drop", "retry", "rcv", "wait"]
    assert row[-6:] == ["60%", "3", "1", "7", "3", "12"]
    assert summary.recovered_calls == 3 and summary.wait_s == pytest.approx(12.0)
