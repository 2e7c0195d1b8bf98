"""Differential corpus: cua_native's dialects beside the upstream parsers, run for real.

``tests/fixtures/differential.jsonl`` (built by ``upstream/build_corpus.py``) holds model outputs,
the action each means and what the vendored upstream parsers (MAI-UI, Qwen-Agent, the Qwen3-VL
notebook, MobileWorld's Qwen3-VL agent) read. Every line is checked three ways: cua_native reads
the expected action (and thought / ``Action:`` summary where given);
upstream, run now, still reads what the line records (so the record is upstream's behaviour, not
a copy of ours); a line where an upstream reads something else says why in ``note``. The 3,789
real MAI-UI grounding outputs are read by both MAI-UI dialect names and by MAI-UI's own
``parse_grounding_response``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from run_upstream import READERS, agrees

from cua_native.actions.dialects import get_dialect
from cua_native.actions.models import action_to_json, points_of

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _lines(name: str) -> list[dict[str, Any]]:
    text = (FIXTURES / name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


CORPUS = _lines("differential.jsonl")
GROUNDING = _lines("mai_ui_grounding_real.jsonl")


def _matches(action: dict[str, Any], expect: dict[str, Any]) -> bool:
    if set(action) != set(expect):
        return False
    for key, want in expect.items():
        got = action[key]
        if isinstance(want, float) and isinstance(got, float):
            if not math.isclose(got, want, abs_tol=1e-9):
                return False
        elif got != want:
            return False
    return True


def test_corpus_covers_the_reproduced_cases() -> None:
    ids = {case["id"].split("/")[1] for case in CORPUS}
    assert {"decoy_in_think", "tag_named_in_thought", "call_thinking_call"} <= ids
    assert {"summary_unquoted", "grounding"} <= ids
    assert {"mw_tag_named_in_thought", "mw_decoy_in_thought", "mw_action_word_in_thought"} <= ids
    readers = {name for case in CORPUS for name in case["upstream"]}
    assert readers == {
        "mai_ui",
        "mai_ui_grounding",
        "qwen_agent",
        "qwen3_vl_cookbook",
        "mobileworld",
    }
    assert len(CORPUS) >= 300


@pytest.mark.parametrize("case", CORPUS, ids=[c["id"] for c in CORPUS])
def test_cua_native_reads_the_expected_action(case: dict[str, Any]) -> None:
    parsed = get_dialect(case["dialect"]).parse(case["text"])
    expect = case["expect"]
    if "error" in expect:
        assert parsed.error is not None and parsed.error.kind == expect["error"], parsed
        return
    assert parsed.ok, parsed.error
    assert parsed.action is not None
    assert _matches(action_to_json(parsed.action), expect), (action_to_json(parsed.action), expect)
    if "expect_thought" in case:
        assert parsed.thought == case["expect_thought"]
    if "expect_summary" in case:
        assert parsed.summary == case["expect_summary"]


@pytest.mark.parametrize("case", CORPUS, ids=[c["id"] for c in CORPUS])
def test_upstream_still_reads_what_the_corpus_records(case: dict[str, Any]) -> None:
    for name, record in case["upstream"].items():
        assert READERS[name](case["text"]) == record, name
    grid = {"mai_ui": None, "mai_ui_grounding": None, "mobileworld": None}
    for name, record in case["upstream"].items():
        agreed = agrees(
            record, case["expect"], grid=grid.get(name, 999.0), summary=case.get("expect_summary")
        )
        assert agreed == case["agree"][name], name
    if not all(case["agree"].values()):
        assert case.get("note"), "a disagreement with upstream must say why"


@pytest.mark.parametrize("dialect", ["mai_ui", "mai_ui_grounding"])
def test_real_grounding_outputs_read_like_mai_ui_reads_them(dialect: str) -> None:
    """Both dialect names read every real grounding output as MAI-UI's own parser does, except
    the one whose answer is not JSON (an extra ``}``), which upstream rejects and we read."""
    parser = get_dialect(dialect)
    differ = []
    for line in GROUNDING:
        parsed = parser.parse(line["text"])
        assert parsed.ok, (line["source"], parsed.error)
        upstream = READERS["mai_ui_grounding"](line["text"])
        ((x, y),) = points_of(parsed.action)
        if not upstream["ok"]:
            differ.append(line["source"]["id"])
            continue
        ux, uy = upstream["arguments"]["coordinate"]
        assert math.isclose(x, ux, abs_tol=1e-9) and math.isclose(y, uy, abs_tol=1e-9)
    assert differ == ["macos_common_macos_20"]
