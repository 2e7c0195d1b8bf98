"""Write ``tests/fixtures/differential.jsonl``: model outputs, the action they mean, and what the
upstream parsers (vendored beside this file, run for real) read from them.

    uv run python tests/actions/upstream/build_corpus.py

Every line: ``{"id", "dialect", "text", "expect", "expect_thought"?, "expect_summary"?,
"upstream": {name: record}, "agree": {name: bool}, "note"?}``. ``expect`` is written from the
case's template (the action the output means), never from cua_native's parser; ``upstream`` and
``agree`` come from ``run_upstream``. A case where some upstream disagrees carries a ``note``
saying why cua_native reads it differently. ``tests/actions/test_differential.py`` re-runs both
sides and fails on any change.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from run_upstream import READERS, agrees  # noqa: E402

OUT = HERE.parents[1] / "fixtures" / "differential.jsonl"
G = 999.0


def _unit(v: float) -> float:
    return v / G


def _call(arguments: dict[str, Any], name: str = "mobile_use", *, compact: bool) -> str:
    separators = (",", ":") if compact else (", ", ": ")
    body = json.dumps(
        {"name": name, "arguments": arguments}, separators=separators, ensure_ascii=False
    )
    return f"<tool_call>\n{body}\n</tool_call>"


# (label, upstream arguments, canonical action) for MAI-UI's mobile_use
MAI_ACTIONS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "click",
        {"action": "click", "coordinate": [500, 250]},
        {"type": "click", "x": _unit(500), "y": _unit(250)},
    ),
    (
        "long_press",
        {"action": "long_press", "coordinate": [120, 880]},
        {"type": "long_press", "x": _unit(120), "y": _unit(880), "duration": None},
    ),
    (
        "type",
        {"action": "type", "text": 'say "hi" to Bob'},
        {"type": "type", "text": 'say "hi" to Bob'},
    ),
    (
        "swipe",
        {"action": "swipe", "direction": "up", "coordinate": [500, 700]},
        {
            "type": "swipe",
            "direction": "up",
            "x": _unit(500),
            "y": _unit(700),
            "x2": None,
            "y2": None,
        },
    ),
    ("open", {"action": "open", "text": "Settings"}, {"type": "open_app", "name": "Settings"}),
    (
        "system_button",
        {"action": "system_button", "button": "back"},
        {"type": "system_button", "button": "back"},
    ),
    ("wait", {"action": "wait"}, {"type": "wait", "seconds": None}),
    (
        "terminate",
        {"action": "terminate", "status": "success"},
        {"type": "terminate", "status": "success"},
    ),
    ("answer", {"action": "answer", "text": "42 km"}, {"type": "answer", "text": "42 km"}),
    (
        "drag",
        {"action": "drag", "start_coordinate": [100, 200], "end_coordinate": [800, 200]},
        {"type": "drag", "x": _unit(100), "y": _unit(200), "x2": _unit(800), "y2": _unit(200)},
    ),
]
MAI_MCP = (
    {"location": "SF"},
    {"type": "tool_call", "name": "get_weather", "arguments": {"location": "SF"}},
)

# (label, upstream arguments, canonical action) for Qwen3-VL's mobile_use (999 grid)
QWEN_ACTIONS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "click",
        {"action": "click", "coordinate": [447, 81]},
        {"type": "click", "x": _unit(447), "y": _unit(81)},
    ),
    (
        "long_press",
        {"action": "long_press", "coordinate": [300, 600], "time": 2},
        {"type": "long_press", "x": _unit(300), "y": _unit(600), "duration": 2.0},
    ),
    (
        "swipe",
        {"action": "swipe", "coordinate": [500, 800], "coordinate2": [500, 200]},
        {
            "type": "swipe",
            "direction": None,
            "x": _unit(500),
            "y": _unit(800),
            "x2": _unit(500),
            "y2": _unit(200),
        },
    ),
    (
        "type",
        {"action": "type", "text": "Qwen-VL 'latest'"},
        {"type": "type", "text": "Qwen-VL 'latest'"},
    ),
    (
        "system_button",
        {"action": "system_button", "button": "Back"},
        {"type": "system_button", "button": "back"},
    ),
    ("wait", {"action": "wait", "time": 2}, {"type": "wait", "seconds": 2.0}),
    (
        "terminate",
        {"action": "terminate", "status": "failure"},
        {"type": "terminate", "status": "failure"},
    ),
    (
        "answer",
        {"action": "answer", "text": "It is 5 pm."},
        {"type": "answer", "text": "It is 5 pm."},
    ),
    ("key", {"action": "key", "text": "KEYCODE_ENTER"}, {"type": "key", "keys": ["KEYCODE_ENTER"]}),
    ("open", {"action": "open", "text": "Bilibili"}, {"type": "open_app", "name": "Bilibili"}),
]

DECOY = {"action": "wait"}
THOUGHT = "The search bar is at the top; I tap it."


def _mai_cases() -> list[dict[str, Any]]:
    cases = []
    for (label, args, expect), compact in itertools.product(MAI_ACTIONS, (True, False)):
        call = _call(args, compact=compact)
        decoy = _call(DECOY, compact=compact)
        t = THOUGHT
        templates: list[tuple[str, str, dict[str, Any] | None, str | None, str | None]] = [
            ("thinking", f"<thinking>\n{t}\n</thinking>\n{call}", expect, t, None),
            ("think", f"<think>\n{t}\n</think>\n{call}", expect, t, None),
            ("bare_close", f"{t}\n</think>\n{call}", expect, t, None),
            (
                "decoy_in_think",
                f"<think>\nMaybe {decoy} first? No.\n</think>\n{call}",
                expect,
                f"Maybe {decoy} first? No.",
                None,
            ),
            (
                "decoy_in_thinking",
                f"<thinking>\nMaybe {decoy} first? No.\n</thinking>\n{call}",
                expect,
                f"Maybe {decoy} first? No.",
                None,
            ),
            (
                "decoy_bare_close",
                f"Maybe {decoy} first? No.\n</think>\n{call}",
                expect,
                f"Maybe {decoy} first? No.",
                None,
            ),
            (
                "tag_named_in_thought",
                f"<thinking>I will emit a <tool_call> that acts.</thinking>\n{call}",
                expect,
                "I will emit a <tool_call> that acts.",
                None,
            ),
            (
                "call_thinking_call",
                f"{call}\n<thinking>\n{t}\n</thinking>\n{call}",
                expect,
                t,
                "the call before the thinking block is read as upstream reads the one after it",
            ),
            ("two_calls", f"<thinking>\n{t}\n</thinking>\n{call}\n{decoy}", expect, t, None),
            (
                "no_thinking",
                call,
                expect,
                None,
                "upstream MAI-UI needs a thinking block (TypeError without one); cua_native reads"
                " the call",
            ),
            (
                "unclosed_thinking_with_call",
                f"<thinking>\n{t} {call}",
                {"error": "format"},
                None,
                None,
            ),
        ]
        for name, text, exp, thought, note in templates:
            cases.append(
                _case(
                    f"mai_ui/{name}/{label}/{'compact' if compact else 'spaced'}",
                    "mai_ui",
                    text,
                    exp,
                    thought,
                    None,
                    note,
                )
            )
    mcp_args, mcp_expect = MAI_MCP
    body = json.dumps({"name": "get_weather", "arguments": mcp_args})
    cases.append(
        _case(
            "mai_ui/mcp",
            "mai_ui",
            f"<thinking>\nask the weather tool\n</thinking>\n<tool_call>\n{body}\n</tool_call>",
            mcp_expect,
            "ask the weather tool",
            None,
            "upstream MAI-UI drops the tool name (reads only the arguments); cua_native keeps it",
        )
    )
    return cases


def _grounding_cases() -> list[dict[str, Any]]:
    t = 'Thought: The instruction "add this page to favourites" is the star icon.'
    click = {"type": "click", "x": _unit(925), "y": _unit(41)}
    extra = "the extra } is not JSON: upstream raises, cua_native reads the object before it"
    rows = [
        (
            "plain",
            f"<grounding_think>\n{t}\n</grounding_think>\n<answer>\n"
            '{"coordinate":[925,41]}\n</answer>',
            click,
            None,
        ),
        (
            "extra_brace",
            f"<grounding_think>\n{t}\n</grounding_think>\n<answer>\n"
            '{"coordinate":[925,41]}}\n</answer>',
            click,
            extra,
        ),
        (
            "spaced",
            f"<grounding_think>{t}</grounding_think>\n<answer>\n"
            '{"coordinate": [925, 41]}\n</answer>',
            click,
            None,
        ),
        ("no_think", '<answer>\n{"coordinate":[925,41]}\n</answer>', click, None),
        (
            "unclosed_answer",
            f'<grounding_think>\n{t}\n</grounding_think>\n<answer>\n{{"coordinate":[925,41]}}',
            click,
            "upstream needs </answer>; cua_native reads an unclosed answer at the end",
        ),
        (
            "float_fraction",
            '<answer>\n{"coordinate":[0.52,0.25]}\n</answer>',
            {"type": "click", "x": 0.52, "y": 0.25},
            "fractions in [0, 1] are read as normalised (docs/actions.md); upstream divides by 999",
        ),
    ]
    cases = []
    for dialect in ("mai_ui", "mai_ui_grounding"):
        for name, text, expect, note in rows:
            thought = t if "grounding_think" in text else None
            cases.append(
                _case(f"{dialect}/grounding/{name}", dialect, text, expect, thought, None, note)
            )
    return cases


def _qwen_cases() -> list[dict[str, Any]]:
    cases = []
    summaries = [
        ("double_quoted", '"I tapped the search bar."', "I tapped the search bar."),
        ("unquoted", "Type 'hello'", "Type 'hello'"),
        ("inner_single", "\"Tap 'OK' to confirm\"", "Tap 'OK' to confirm"),
        ("single_wrapping_double", "'Open the \"Files\" app'", 'Open the "Files" app'),
        ("curly", "“Tap Next”", "Tap Next"),
        ("trailing_quote_only", 'Search for "Musk"', 'Search for "Musk"'),
    ]
    for label, args, expect in QWEN_ACTIONS:
        call = _call(args, compact=False)
        decoy = _call(DECOY, compact=False)
        t = THOUGHT
        for sname, written, summary in summaries:
            text = f"Thought: {t}\nAction: {written}\n{call}"
            cases.append(
                _case(
                    f"qwen3_vl/summary_{sname}/{label}", "qwen3_vl", text, expect, t, summary, None
                )
            )
        decoy_note = (
            "the notebook splits at the first <tool_call>, inside the reasoning;"
            " the action is the call after </think>"
        )
        templates = [
            ("bare_close", f"{t}\n</think>\n\n{call}", expect, t, None),
            ("think", f"<think>\n{t}\n</think>\n\n{call}", expect, t, None),
            (
                "decoy_in_think",
                f"<think>\nMaybe {decoy} first? No.\n</think>\n{call}",
                expect,
                f"Maybe {decoy} first? No.",
                decoy_note,
            ),
            (
                "decoy_bare_close",
                f"Maybe {decoy} first? No.\n</think>\n\n{call}",
                expect,
                f"Maybe {decoy} first? No.",
                decoy_note,
            ),
            (
                "tag_named_in_think",
                f"<think>\nI will emit a <tool_call> that acts.\n</think>\n\n{call}",
                expect,
                "I will emit a <tool_call> that acts.",
                "the notebook splits at the first '<tool_call>\\n'; the one named in the"
                " reasoning has no newline after it",
            ),
            ("call_only", call, expect, None, None),
            (
                "unclosed_think_with_call",
                f"<think>\n{t} {call}",
                {"error": "format"},
                None,
                "a call inside an unclosed <think> is reasoning (Qwen-Agent reads none either);"
                " the notebook takes it",
            ),
        ]
        for name, text, exp, thought, note in templates:
            cases.append(
                _case(f"qwen3_vl/{name}/{label}", "qwen3_vl", text, exp, thought, None, note)
            )
    return cases


def _applicable(dialect: str, text: str) -> tuple[str, ...]:
    if dialect == "qwen3_vl":
        return ("qwen_agent", "qwen3_vl_cookbook")
    return ("mai_ui_grounding",) if "<answer>" in text else ("mai_ui",)


def _case(
    case_id: str,
    dialect: str,
    text: str,
    expect: dict[str, Any],
    thought: str | None,
    summary: str | None,
    note: str | None,
) -> dict[str, Any]:
    grid = {"mai_ui": None, "mai_ui_grounding": None, "qwen_agent": G, "qwen3_vl_cookbook": G}
    upstream = {name: READERS[name](text) for name in _applicable(dialect, text)}
    agree = {name: agrees(rec, expect, grid=grid[name]) for name, rec in upstream.items()}
    line: dict[str, Any] = {"id": case_id, "dialect": dialect, "text": text, "expect": expect}
    if thought is not None:
        line["expect_thought"] = thought
    if summary is not None:
        line["expect_summary"] = summary
    line["upstream"] = upstream
    line["agree"] = agree
    if note is not None:
        line["note"] = note
    return line


def build() -> list[dict[str, Any]]:
    return _mai_cases() + _grounding_cases() + _qwen_cases()


def main() -> None:
    cases = build()
    with OUT.open("w", encoding="utf-8") as handle:
        for case in cases:
            handle.write(json.dumps(case, ensure_ascii=False) + "\n")
    disagreements = sum(1 for c in cases if not any(c["agree"].values()))
    print(f"{len(cases)} cases -> {OUT} ({disagreements} where no upstream agrees)")


if __name__ == "__main__":
    main()
