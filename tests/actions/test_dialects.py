"""Dialect registry, exact output formats and the published fixtures written back byte-exact."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cua_native.actions.dialects import DIALECT_NAMES, Dialect, get_dialect
from cua_native.actions.models import (
    Click,
    Drag,
    Key,
    LongPress,
    OpenApp,
    Scroll,
    Swipe,
    SystemButton,
    Terminate,
    ToolCall,
    TypeText,
    Wait,
)

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _doc_fixtures() -> list[dict]:
    lines = (FIXTURES / "agent_formats.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_registry_names_and_protocol() -> None:
    assert set(DIALECT_NAMES) >= {"mai_ui", "mai_ui_grounding", "qwen3_vl"}
    for name in DIALECT_NAMES:
        dialect = get_dialect(name)
        assert isinstance(dialect, Dialect)
        assert dialect.name == name


def test_unknown_dialect_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="mai_ui, mai_ui_grounding, qwen3_vl"):
        get_dialect("gpt")


@pytest.mark.parametrize(
    ("name", "options"),
    [("qwen3_vl", {"tool": "shell"}), ("qwen3_vl", {"colour": 1}), ("mai_ui", {"scale": 0})],
)
def test_bad_options_are_value_errors(name: str, options: dict) -> None:
    with pytest.raises(ValueError):
        get_dialect(name, **options)


def test_dialects_are_immutable() -> None:
    dialect = get_dialect("qwen3_vl", tool="computer_use")
    with pytest.raises(dataclasses.FrozenInstanceError):
        dialect.tool = "mobile_use"  # type: ignore[misc]


def test_grid_defaults() -> None:
    assert get_dialect("qwen3_vl").coordinate_step() == pytest.approx(1 / 999)
    assert get_dialect("qwen3_vl", tool="computer_use").coordinate_step() == pytest.approx(1 / 1000)
    assert get_dialect("mai_ui").coordinate_step() == pytest.approx(1 / 999)


@pytest.mark.parametrize("fixture", [f for f in _doc_fixtures() if f["dialect"] == "mai_ui"])
def test_mai_history_fixtures_are_rewritten_byte_exact(fixture: dict) -> None:
    dialect = get_dialect("mai_ui")
    parsed = dialect.parse(fixture["text"])
    assert parsed.ok
    assert dialect.format(parsed.action, thought=parsed.thought) == fixture["text"]


def test_qwen_fixture_is_rewritten_byte_exact() -> None:
    (fixture,) = [
        f for f in _doc_fixtures() if f["dialect"] == "qwen3_vl" and "Thought" in f["text"]
    ]
    dialect = get_dialect("qwen3_vl")
    parsed = dialect.parse(fixture["text"])
    assert parsed.summary == "I tapped on the search bar to begin searching for Musk."
    assert parsed.thought is not None and parsed.thought.startswith("To search for Musk")
    text = dialect.format(parsed.action, thought=parsed.thought, summary=parsed.summary)
    assert text == fixture["text"]


def test_qwen25_pixel_fixture_is_rewritten_byte_exact() -> None:
    fixture = next(f for f in _doc_fixtures() if f["source"]["research_fixture"] == 13)
    dialect = get_dialect("qwen2_5_vl")
    size = tuple(fixture["image_size"])
    parsed = dialect.parse(fixture["text"], image_size=size)
    assert dialect.format(parsed.action, image_size=size) == fixture["text"]


def test_grounding_format() -> None:
    dialect = get_dialect("mai_ui_grounding")
    text = dialect.format(Click(x=925 / 999, y=41 / 999), thought="Thought: star icon")
    assert text == (
        '<grounding_think>\nThought: star icon\n</grounding_think>\n<answer>\n{"coordinate":[925,41]}'
        "\n</answer>"
    )
    with pytest.raises(ValueError, match="only click"):
        dialect.format(TypeText(text="x"))


def test_mai_format_details() -> None:
    mai = get_dialect("mai_ui")
    drag = mai.format(Drag(x=0.1, y=0.2, x2=0.5, y2=0.6), thought="t")
    assert '"start_coordinate":[100,200],"end_coordinate":[500,599]' in drag  # ints, not floats
    mcp = mai.format(ToolCall(name="get_weather", arguments={"city": "東京"}))
    assert '{"name":"get_weather","arguments":{"city":"\\u6771\\u4eac"}}' in mcp  # name kept
    assert mai.format(Terminate(status="failure")).count('"status":"fail"') == 1
    assert mai.format(Wait()).startswith("<thinking>\n\n</thinking>\n<tool_call>\n")
    assert '"direction":"up","coordinate":[500,500]' in mai.format(
        Swipe(direction="up", x=500 / 999, y=500 / 999)
    )


@pytest.mark.parametrize(
    "action",
    [
        Scroll(dy=10),
        Key(keys=["ctrl", "c"]),
        Swipe(x=0.1, y=0.1, x2=0.2, y2=0.2),
        LongPress(x=0.1, y=0.1, duration=2),
        Wait(seconds=2),
        Drag(x2=0.2, y2=0.3),
        ToolCall(name="mobile_use"),
    ],
)
def test_mai_refuses_what_it_cannot_express(action: object) -> None:
    with pytest.raises(ValueError):
        get_dialect("mai_ui").format(action)  # type: ignore[arg-type]


def test_qwen_format_details() -> None:
    mobile = get_dialect("qwen3_vl")
    assert mobile.format(SystemButton(button="home")) == (
        '<tool_call>\n{"name": "mobile_use", "arguments": {"action": "system_button", "button": '
        '"Home"}}\n</tool_call>'
    )
    assert '"text": "你好"' in mobile.format(TypeText(text="你好"))  # ensure_ascii=False
    assert '{"action": "long_press", "coordinate": [100, 200], "time": 2}' in mobile.format(
        LongPress(x=100 / 999, y=200 / 999, duration=2.0)
    )
    assert '"action": "open", "text": "Clock"' in mobile.format(OpenApp(name="Clock"))
    computer = get_dialect("qwen3_vl", tool="computer_use")
    assert '{"action": "hscroll", "pixels": -40}' in computer.format(Scroll(dx=-40))
    assert '{"action": "left_click_drag", "coordinate": [200, 300]}' in computer.format(
        Drag(x2=0.2, y2=0.3)
    )
    assert computer.format(Click(x=0.5, y=0.25), summary="Tap it").startswith('Action: "Tap it"\n')
    with pytest.raises(ValueError, match="computer_use"):
        mobile.format(Key(keys=["ctrl", "c"]))
    with pytest.raises(ValueError):
        computer.format(Scroll(dx=1, dy=1))
    with pytest.raises(ValueError, match="image_size"):
        get_dialect("qwen2_5_vl").format(Click(x=0.5, y=0.5))


def test_qwen25_needs_image_size_for_points_only() -> None:
    dialect = get_dialect("qwen2_5_vl")
    text = '<tool_call>\n{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [1, 2]}}\n</tool_call>'
    parsed = dialect.parse(text)
    assert parsed.error is not None and parsed.error.kind == "tool_arg"
    assert "image_size" in parsed.error.message
    wait = '<tool_call>\n{"name": "mobile_use", "arguments": {"action": "wait"}}\n</tool_call>'
    assert dialect.parse(wait).ok
