"""The GPU credit bench reads the trainer's step table by column name (the table's own header)."""

from __future__ import annotations

from pathlib import Path

from bench.experiments.credit_gpu import flat_and_steps, step_rows

PLAIN = """\
step episodes  success   reward      ±  turns samples uniform     loss  |adv|  logp Δ  |grad|    sec  roll  rej drop retry
   0      104      83%    0.826  0.380    4.2      67      23   0.0386  0.610       -   0.216   29.6   69%    0    0     0
   1      104      84%    0.835  0.376    4.0      33      24   0.1777  0.714       -   0.247   23.8   83%    0    0     0
eval after step 1: success 80%
"""
CREDIT = """\
step episodes  success   reward      ±  turns samples uniform     loss  |adv|  logp Δ  |grad|    sec  roll  rej drop retry branch   +env    env  signal replay
   0      117      72%    0.718  0.452    4.0     144      20  -0.0189  1.070       -   0.098   62.2   47%    0    0     0     13     33    472   6/26       0
   1      110      74%    0.736  0.443    4.1      86      23   0.0326  1.087       -   0.098   32.9   61%    0    0     0      6     17    454   3/26       2
"""


def test_plain_rows_count_uniform_groups_and_turns(tmp_path: Path) -> None:
    log = tmp_path / "plain.log"
    log.write_text(PLAIN)
    rows = step_rows(log)
    assert [r["uniform"] for r in rows] == ["23", "24"]
    assert rows[0]["logp_delta"] == "-" and rows[1]["sec"] == "23.8"
    figures = flat_and_steps(rows, groups=26)
    assert figures["flat_share"] == (23 + 24) / 52
    assert figures["env_steps"] == round(4.2 * 104) + round(4.0 * 104)
    assert figures["branch_points"] == 0


def test_credit_rows_count_signal_env_branches_and_replays(tmp_path: Path) -> None:
    log = tmp_path / "all.log"
    log.write_text(CREDIT)
    figures = flat_and_steps(step_rows(log), groups=26)
    assert figures == {
        "flat_share": (20 + 23) / 52,
        "env_steps": 472 + 454,
        "branch_points": 19,
        "replayed": 2,
    }
