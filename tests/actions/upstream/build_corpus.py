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


def _mobileworld_cases() -> list[dict[str, Any]]:
    """MobileWorld's own layout (``Thought:`` / ``Action:`` / one ``<tool_call>``) and its edges."""
    t, s = THOUGHT, "Tap the search bar"
    decoy = _call(DECOY, compact=False)
    cases = []
    for label, args, expect in QWEN_ACTIONS:
        call = _call(args, compact=False)
        templates: list[tuple[str, str, str | None, str | None, str | None]] = [
            ("layout", f"Thought: {t}\nAction: {s}\n{call}", t, s, None),
            (
                "tag_named_in_thought",
                f'Thought: I will emit a <tool_call> that acts.\nAction: "{s}"\n{call}',
                "I will emit a <tool_call> that acts.",
                s,
                "the notebook splits at the first <tool_call>, in the Thought: line",
            ),
            (
                "decoy_in_thought",
                f'Thought: Maybe {decoy} first? No.\nAction: "{s}"\n{call}',
                f"Maybe {decoy} first? No.",
                s,
                "Qwen-Agent and the notebook take the first <tool_call>, written in the Thought:"
                " line; the action is the call after the Action: line",
            ),
            (
                "call_before_action_line",
                f'Thought: {t}\n{decoy}\nAction: "{s}"\n{call}',
                f"{t}\n{decoy}",
                s,
                "Qwen-Agent and the notebook take the first <tool_call>; the action is the call"
                " after the Action: line",
            ),
            (
                "action_word_in_thought",
                f'Thought: The Action: menu is greyed out.\nAction: "{s}"\n{call}',
                "The Action: menu is greyed out.",
                s,
                None,
            ),
            (
                "one_line",
                f'Thought: {t} Action: "{s}" ' + call.replace("\n", ""),
                t,
                s,
                "the notebook needs a newline after <tool_call>",
            ),
            (
                "think_then_lines",
                f'<think>\nfirst look\n</think>\nThought: {t}\nAction: "{s}"\n{call}',
                f"first look\n{t}",
                s,
                None,
            ),
            ("thought_only", f"Thought: {t}\n{call}", t, None, None),
            (
                "unclosed_call",
                f'Thought: {t}\nAction: "{s}"\n' + call.removesuffix("\n</tool_call>"),
                t,
                s,
                "Qwen-Agent reads no call without </tool_call>",
            ),
        ]
        for name, text, thought, summary, note in templates:
            cases.append(
                _case(
                    f"qwen3_vl/mw_{name}/{label}", "qwen3_vl", text, expect, thought, summary, note
                )
            )
    head = f'Thought: {t}\nAction: "{s}"\n'
    box_note = (
        "a box is read as its centre (as MobileWorld reads it); Qwen-Agent and the notebook"
        " pass the four numbers on"
    )
    one_offs: list[tuple[str, str, dict[str, Any], str | None]] = [
        (
            "box",
            _call({"action": "click", "coordinate": [400, 60, 494, 102]}, compact=False),
            {"type": "click", "x": _unit(447), "y": _unit(81)},
            box_note,
        ),
        (
            "swipe_box",
            _call(
                {"action": "swipe", "coordinate": [500, 800], "coordinate2": [480, 180, 520, 220]},
                compact=False,
            ),
            dict(next(e for label, _, e in QWEN_ACTIONS if label == "swipe")),
            box_note,
        ),
        (
            "fraction",
            _call({"action": "click", "coordinate": [0.52, 0.25]}, compact=False),
            {"type": "click", "x": 0.52, "y": 0.25},
            None,
        ),
        (
            "menu",
            _call({"action": "system_button", "button": "Menu"}, compact=False),
            {"type": "system_button", "button": "menu"},
            None,
        ),
        (
            "ask_user",
            _call({"action": "ask_user", "text": "Which account?"}, compact=False),
            {"type": "ask_user", "text": "Which account?"},
            None,
        ),
        (
            "mcp",
            _call({"city": "Hangzhou"}, name="get_weather", compact=False),
            {"type": "tool_call", "name": "get_weather", "arguments": {"city": "Hangzhou"}},
            None,
        ),
        (
            "trailing_comma",
            '<tool_call>\n{"name": "mobile_use", "arguments": {"action": "click",'
            ' "coordinate": [447, 81],}}\n</tool_call>',
            {"type": "click", "x": _unit(447), "y": _unit(81)},
            "the notebook's json.loads rejects a trailing comma; cua_native and Qwen-Agent (json5)"
            " repair it",
        ),
    ]
    for name, call, expect, note in one_offs:
        cases.append(_case(f"qwen3_vl/mw_{name}", "qwen3_vl", head + call, expect, t, s, note))
    return cases


_MOBILEWORLD_WHY = (
    (
        "TypeError: 'NoneType' object is not subscriptable",
        "MobileWorld reads a call only after Thought: and Action: lines (TypeError without"
        " them); cua_native reads the call",
    ),
    (
        "no device action for 'key'",
        "MobileWorld's device has no mobile_use key action (its prompt offers none) and does"
        " nothing; cua_native reads the key press",
    ),
    (
        "ValueError: Unsupported button: Menu",
        "MobileWorld's device has no Menu button and raises; the canonical action keeps it (the"
        " gym decides what it can press)",
    ),
    (
        "ValueError: Failed to parse tool_call JSON",
        "MobileWorld's json.loads rejects non-strict JSON; cua_native repairs it",
    ),
)


def _mobileworld_note(
    record: dict[str, Any], expect: dict[str, Any], summary: str | None, text: str
) -> str:
    """Why MobileWorld's reading differs from ``expect``; raises for a difference not explained."""
    if not record["ok"] and text.count("Action:") > 1:
        return (
            "MobileWorld splits at the first 'Action:', inside the Thought: text, and finds no"
            " call before the next one (TypeError); cua_native reads the Action: line"
        )
    if not record["ok"]:
        for prefix, why in _MOBILEWORLD_WHY:
            if record["error"].startswith(prefix):
                return why
    elif record["summary"] != summary:
        if summary is not None and "Action: " in str(record["thought"]) + str(record["summary"]):
            return (
                "MobileWorld splits at the first 'Action:', inside the Thought: text; cua_native"
                " at the Action: line"
            )
        return (
            "MobileWorld strips only double quotes from the Action: line; cua_native strips one"
            " matching pair of double, single or curly quotes"
        )
    elif expect.get("x") == 0.52:
        return (
            "fractions in [0, 1] are read as normalised (docs/actions.md); MobileWorld divides"
            " by 999"
        )
    raise AssertionError(f"unexplained MobileWorld difference: {record} vs {expect}")


def _applicable(dialect: str, text: str) -> tuple[str, ...]:
    if dialect == "qwen3_vl":
        return ("qwen_agent", "qwen3_vl_cookbook", "mobileworld")
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
    grid = {
        "mai_ui": None,
        "mai_ui_grounding": None,
        "qwen_agent": G,
        "qwen3_vl_cookbook": G,
        "mobileworld": None,
    }
    upstream = {name: READERS[name](text) for name in _applicable(dialect, text)}
    agree = {
        name: agrees(rec, expect, grid=grid[name], summary=summary)
        for name, rec in upstream.items()
    }
    line: dict[str, Any] = {"id": case_id, "dialect": dialect, "text": text, "expect": expect}
    if thought is not None:
        line["expect_thought"] = thought
    if summary is not None:
        line["expect_summary"] = summary
    line["upstream"] = upstream
    line["agree"] = agree
    if "mobileworld" in agree and not agree["mobileworld"]:
        why = "MobileWorld: " + _mobileworld_note(upstream["mobileworld"], expect, summary, text)
        note = why if note is None else f"{note}; {why}"
    if note is not None:
        line["note"] = note
    return line


def build() -> list[dict[str, Any]]:
    return _mai_cases() + _grounding_cases() + _qwen_cases() + _mobileworld_cases()


def main() -> None:
    cases = build()
    with OUT.open("w", encoding="utf-8") as handle:
        for case in cases:
            handle.write(json.dumps(case, ensure_ascii=False) + "\n")
    disagreements = sum(1 for c in cases if not any(c["agree"].values()))
    print(f"{len(cases)} cases -> {OUT} ({disagreements} where no upstream agrees)")


if __name__ == "__main__":
    main()
