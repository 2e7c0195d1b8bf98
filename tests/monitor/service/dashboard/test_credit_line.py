"""The dashboard's steps table shows the per-step credit figures of a step, from either path."""

from __future__ import annotations

import json

from cua_native.monitor.service.dashboard.queries import credit_line


def test_embedded_metrics_become_one_line() -> None:
    metrics = {"success_rate": 0.5, "credit/branch_points": 3, "credit/extra_env_steps": 9}
    assert credit_line(json.dumps(metrics)) == "branch_points 3 · extra_env_steps 9"


def test_areals_stats_show_their_mean() -> None:
    metrics = {
        "rollout/cua/credit/flat_groups/avg": 0.25,
        "rollout/cua/credit/flat_groups/min": 0.0,
        "rollout/cua/reward/avg": 0.4,
    }
    assert credit_line(json.dumps(metrics)) == "flat_groups (mean) 0.25"


def test_a_step_without_credit_figures_has_no_line() -> None:
    assert credit_line(json.dumps({"success_rate": 0.5})) is None
    assert credit_line(None) is None
    assert credit_line("not json") is None
    assert credit_line("[1, 2]") is None
