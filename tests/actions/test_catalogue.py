"""Every item of the malformed-output catalogue (``tests/fixtures/malformed.jsonl``, see ``tests/fixtures/README.md``) has a fixed outcome."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cua_native.actions.dialects import get_dialect
from cua_native.actions.models import action_from_json, action_to_json

FIXTURES = Path(__file__).parents[1] / "fixtures"
CASES = [
    json.loads(line)
    for line in (FIXTURES / "malformed.jsonl").read_text(encoding="utf-8").splitlines()
    if line.strip()
]


def _parse(case: dict[str, Any]):
    dialect = get_dialect(case["dialect"], **case.get("options", {}))
    size = tuple(case["image_size"]) if "image_size" in case else None
    return dialect, dialect.parse(case["text"], image_size=size)


def test_every_catalogue_item_is_covered() -> None:
    items = {case["source"]["catalogue_item"] for case in CASES}
    assert set(range(1, 16)) <= items


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{c['source']['catalogue_item']}-{c['source']['note']}"
)
def test_catalogue_case(case: dict[str, Any], same_action: Any) -> None:
    dialect, parsed = _parse(case)
    expect = case["expect"]
    if "error" in expect:
        assert parsed.error is not None, parsed
        assert parsed.error.kind == expect["error"]
        assert parsed.action is None
        assert "unexpected" not in parsed.error.message
    else:
        assert parsed.ok, parsed.error
        wanted = action_to_json(action_from_json(expect))
        assert same_action(wanted, action_to_json(parsed.action), dialect.coordinate_step())


def _one(dialect: str, text: str, **options: Any):
    return get_dialect(dialect, **options).parse(text)


CLICK = '{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [500, 250]}}'


def test_thought_from_bare_think_and_thinking_tags() -> None:
    assert _one("mai_ui", f"plan A</think>\n<tool_call>\n{CLICK}\n</tool_call>").thought == "plan A"
    assert (
        _one("mai_ui", f"<thinking>\nplan B\n</thinking><tool_call>{CLICK}</tool_call>").thought
        == "plan B"
    )
    qwen = _one("qwen3_vl", f'reason</think>\nThought: go.\nAction: "Tap."\n<tool_call>\n{CLICK}')
    assert (qwen.thought, qwen.summary) == ("reason\ngo.", "Tap.")


def test_repairs_are_reported_as_warnings() -> None:
    extra = _one("mai_ui", f"<tool_call>\n{CLICK}}}\n</tool_call>")
    assert any("ignored text" in w for w in extra.warnings)
    clamped = _one("mai_ui", CLICK.replace("500", "1000").join(["<tool_call>", "</tool_call>"]))
    assert any("clamped" in w for w in clamped.warnings)
    quoted = _one("qwen3_vl", f"<tool_call>{CLICK.replace(chr(34), chr(39))}</tool_call>")
    assert quoted.ok and any("repaired" in w for w in quoted.warnings)
    unclosed = _one("qwen3_vl", f"<tool_call>\n{CLICK}\n⚗")
    assert unclosed.ok and "<tool_call> not closed" in unclosed.warnings


def test_extra_calls_are_counted() -> None:
    two = _one("qwen3_vl", f"<tool_call>{CLICK}</tool_call>\n<tool_call>{CLICK}</tool_call>" * 2)
    assert two.ok and two.extra_calls == 3


def test_messages_say_what_to_fix() -> None:
    swipe = _one(
        "mai_ui", '<tool_call>{"name":"mobile_use","arguments":{"action":"swipe"}}</tool_call>'
    )
    assert (
        swipe.error is not None and swipe.error.message == "swipe needs a direction or coordinate2"
    )
    pixels = _one(
        "mai_ui", CLICK.replace("[500, 250]", "[948, 1507]").join(["<tool_call>", "</tool_call>"])
    )
    assert pixels.error is not None and "outside the 0-999 grid" in pixels.error.message
    unknown = _one(
        "qwen3_vl", CLICK.replace('"click"', '"zoom"').join(["<tool_call>", "</tool_call>"])
    )
    assert unknown.error is not None and "known actions:" in unknown.error.message


def test_failures_keep_the_thought() -> None:
    parsed = _one(
        "mai_ui", '<thinking>\nI will tap\n</thinking>\n<tool_call>\n{"name": "mobile_use"'
    )
    assert parsed.error is not None and parsed.error.kind == "format"
    assert parsed.thought == "I will tap"


def test_tool_call_text_may_quote_tags() -> None:
    text = '<tool_call>{"name":"mobile_use","arguments":{"action":"type","text":"a</tool_call></think>b"}}</tool_call>'
    parsed = _one("mai_ui", text)
    assert parsed.ok and parsed.action.text == "a</tool_call></think>b"  # type: ignore[union-attr]


def test_mcp_test_shape_and_function_wrapper() -> None:
    mcp = _one(
        "mai_ui",
        '<tool_call>{"name":"mobile_use","arguments":{"action":"mcp_tool","tool_name":"maps","q":"x"}}</tool_call>',
    )
    assert action_to_json(mcp.action) == {
        "type": "tool_call",
        "name": "maps",
        "arguments": {"q": "x"},
    }  # type: ignore[arg-type]
    wrapped = _one(
        "qwen3_vl",
        '{"function": {"name": "mobile_use", "arguments": "{\\"action\\": \\"wait\\"}"}}',
    )
    assert wrapped.ok and wrapped.action.type == "wait"  # type: ignore[union-attr]


def test_non_string_input_is_an_error_value() -> None:
    parsed = get_dialect("mai_ui").parse(None)  # type: ignore[arg-type]
    assert parsed.error is not None and parsed.error.kind == "format"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (
            '<tool_call>{"name":"mobile_use","arguments":{"action":"click","coordinate":[1'
            + "0" * 400
            + ",1]}}",
            "tool_arg",
        ),
        (
            "<tool_call>{'name': 'x', 'arguments': {'a': b'bytes', 'b': {1, 2}}}</tool_call>",
            "format",
        ),
        ('<tool_call>{"name":"mobile_use","arguments":{"action":"wait","time":1e999}}', "tool_arg"),
        ('<tool_call>{"name":"mobile_use","arguments":{"action":["click"]}}', "tool_name"),
        ('<tool_call>{"name":"mobile_use","arguments":{"action":"key","keys":[" "]}}', "tool_arg"),
    ],
)
def test_odd_values_are_typed_errors(text: str, kind: str) -> None:
    parsed = _one("mai_ui", text)
    assert parsed.error is not None and parsed.error.kind == kind, parsed
    assert "unexpected" not in parsed.error.message


def test_python_tuples_become_lists() -> None:
    parsed = _one("mai_ui", "<tool_call>{'name': 'maps', 'arguments': {'at': (1, 2)}}</tool_call>")
    assert parsed.ok and parsed.action.arguments == {"at": [1, 2]}  # type: ignore[union-attr]
