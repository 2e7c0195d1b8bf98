"""Hypothesis properties: round trips for every expressible action, and parse never raises."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cua_native.actions._arguments import KNOWN_ACTION_NAMES
from cua_native.actions.dialects import Dialect, get_dialect
from cua_native.actions.errors import ERROR_KINDS, ParsedOutput
from cua_native.actions.models import (
    Answer,
    AskUser,
    Click,
    DoubleClick,
    Drag,
    Key,
    LongPress,
    MiddleClick,
    MouseMove,
    OpenApp,
    RightClick,
    Scroll,
    Swipe,
    SystemButton,
    Terminate,
    ToolCall,
    TripleClick,
    TypeText,
    Wait,
    action_to_json,
    points_of,
)

unit = st.floats(0.0, 1.0)
seconds = st.none() | st.floats(0.0, 1e5)
free_text = st.text(max_size=40)
name_text = st.text(min_size=1, max_size=20).filter(lambda s: s == s.strip() and s != "")
key_name = st.from_regex(r"[A-Za-z0-9_]{1,12}", fullmatch=True)
line = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9 ,.]{0,30}[A-Za-z0-9.]", fullmatch=True)
json_leaf = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=10)
json_value = st.recursive(
    json_leaf | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
tool_name = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True).filter(
    lambda n: n not in KNOWN_ACTION_NAMES and n not in ("mobile_use", "computer_use")
)
tool_call = st.builds(
    ToolCall, name=tool_name, arguments=st.dictionaries(st.text(max_size=8), json_value, max_size=4)
)
terminate = st.builds(Terminate, status=st.sampled_from(["success", "failure"]))
common = [
    st.builds(TypeText, text=free_text),
    st.builds(Answer, text=free_text),
    terminate,
    tool_call,
]

MAI_ACTIONS = st.one_of(
    st.builds(Click, x=unit, y=unit),
    st.builds(DoubleClick, x=unit, y=unit),
    st.builds(LongPress, x=unit, y=unit),
    st.builds(AskUser, text=free_text),
    st.builds(Swipe, direction=st.sampled_from(["up", "down", "left", "right"])),
    st.builds(Swipe, direction=st.sampled_from(["up", "down", "left", "right"]), x=unit, y=unit),
    st.builds(OpenApp, name=name_text),
    st.builds(Drag, x=unit, y=unit, x2=unit, y2=unit),
    st.builds(SystemButton, button=st.sampled_from(["back", "home", "menu", "enter"])),
    st.just(Wait()),
    *common,
)
QWEN_MOBILE_ACTIONS = st.one_of(
    st.builds(Click, x=unit, y=unit),
    st.builds(LongPress, x=unit, y=unit, duration=seconds),
    st.builds(Swipe, x=unit, y=unit, x2=unit, y2=unit),
    st.builds(Key, keys=st.lists(key_name, min_size=1, max_size=1)),
    st.builds(OpenApp, name=name_text),
    st.builds(AskUser, text=free_text),
    st.builds(SystemButton, button=st.sampled_from(["back", "home", "menu", "enter"])),
    st.builds(Wait, seconds=seconds),
    *common,
)
pixels = st.floats(-1e6, 1e6)
QWEN_COMPUTER_ACTIONS = st.one_of(
    *(
        st.builds(cls, x=unit, y=unit)
        for cls in (Click, DoubleClick, TripleClick, RightClick, MiddleClick, MouseMove)
    ),
    st.builds(Drag, x2=unit, y2=unit),
    st.builds(Scroll, dy=pixels, x=st.none() | unit, y=st.none() | unit).filter(
        lambda s: (s.x is None) == (s.y is None)
    ),
    st.builds(Scroll, dx=pixels.filter(bool)),
    st.builds(Key, keys=st.lists(key_name, min_size=1, max_size=3)),
    st.builds(Wait, seconds=seconds),
    *common,
)
GROUNDING_ACTIONS = st.builds(Click, x=unit, y=unit)

CONFIGS: dict[str, tuple[Dialect, Any]] = {
    "mai_ui": (get_dialect("mai_ui"), MAI_ACTIONS),
    "mai_ui_grounding": (get_dialect("mai_ui_grounding"), GROUNDING_ACTIONS),
    "qwen3_vl-mobile": (get_dialect("qwen3_vl"), QWEN_MOBILE_ACTIONS),
    "qwen3_vl-computer": (get_dialect("qwen3_vl", tool="computer_use"), QWEN_COMPUTER_ACTIONS),
    "qwen2_5_vl": (get_dialect("qwen2_5_vl"), QWEN_MOBILE_ACTIONS),
}
ALL_DIALECTS = [config[0] for config in CONFIGS.values()]
image_sizes = st.tuples(st.integers(64, 4000), st.integers(64, 4000))


@pytest.mark.parametrize("config", list(CONFIGS))
@given(data=st.data())
def test_parse_of_format_is_identity(config: str, data: st.DataObject, same_action: Any) -> None:
    dialect, actions = CONFIGS[config]
    action = data.draw(actions)
    thought = data.draw(st.none() | line)
    summary = data.draw(st.none() | line) if config.startswith("qwen") else None
    size = data.draw(image_sizes) if config == "qwen2_5_vl" else None
    text = dialect.format(action, thought=thought, summary=summary, image_size=size)
    parsed = dialect.parse(text, image_size=size)
    assert parsed.error is None, (text, parsed.error)
    assert same_action(
        action_to_json(action), action_to_json(parsed.action), dialect.coordinate_step(size)
    )
    assert parsed.thought == thought
    assert parsed.summary == summary
    assert parsed.extra_calls == 0


def _check(parsed: ParsedOutput) -> None:
    assert isinstance(parsed, ParsedOutput)
    if parsed.error is None:
        assert parsed.action is not None
        for x, y in points_of(parsed.action):
            assert 0.0 <= x <= 1.0 and 0.0 <= y <= 1.0
    else:
        assert parsed.action is None
        assert parsed.error.kind in ERROR_KINDS
        assert parsed.error.message and "unexpected parser error" not in parsed.error.message


@given(text=st.text(max_size=300), which=st.integers(0, len(ALL_DIALECTS) - 1))
def test_parse_never_raises_on_random_text(text: str, which: int) -> None:
    _check(ALL_DIALECTS[which].parse(text, image_size=(1080, 2400)))


TAGGED = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<thinking>",
        "</think>",
        "<answer>",
        "{",
        "}",
        "[",
        "]",
        '"',
        "'",
        ",",
        ":",
        '"action"',
        '"coordinate"',
        '"name": "mobile_use"',
        '"arguments"',
        "1000",
        "-5",
        "0.5",
        "click",
        "swipe",
        "\n",
    ]
)


@given(
    pieces=st.lists(TAGGED | st.text(max_size=5), max_size=40),
    which=st.integers(0, len(ALL_DIALECTS) - 1),
)
def test_parse_never_raises_on_tag_soup(pieces: list[str], which: int) -> None:
    _check(ALL_DIALECTS[which].parse("".join(pieces)))


def _mutate(text: str, kind: int, at: int) -> str:
    at = at % (len(text) + 1)
    mutations = [
        lambda: text[:at] + text[at + 1 :],  # drop a character (a tag bracket, a brace, a quote)
        lambda: text[:at] + "{" + text[at:],
        lambda: text[:at] + "}" + text[at:],
        lambda: text[:at] + '"' + text[at:],
        lambda: text[:at],  # truncation
        lambda: text.replace("</tool_call>", "", 1),
        lambda: text.replace("<tool_call>", "", 1),
        lambda: text.replace("<thinking>", "", 1),
        lambda: text.replace('"', "'"),
        lambda: re.sub(r"(-?\d+(?:\.\d+)?)", r'"\1"', text),  # stringify numbers
        lambda: (
            text.replace('"action"', '"tmp"')
            .replace('"coordinate"', '"action"')
            .replace('"tmp"', '"coordinate"')
        ),
        lambda: text.replace("mobile_use", "computer_use"),
        lambda: text + text,
        lambda: text.replace("\n", ""),
        lambda: text.replace(",", ",,", 1),
    ]
    return mutations[kind % len(mutations)]()


@pytest.mark.parametrize("config", list(CONFIGS))
@given(data=st.data())
def test_parse_never_raises_on_mutations(config: str, data: st.DataObject) -> None:
    dialect, actions = CONFIGS[config]
    size = (1092, 2408) if config == "qwen2_5_vl" else None
    text = dialect.format(data.draw(actions), thought=data.draw(st.none() | line), image_size=size)
    for _ in range(data.draw(st.integers(1, 3))):
        text = _mutate(text, data.draw(st.integers(0, 100)), data.draw(st.integers(0, 10**6)))
    _check(dialect.parse(text, image_size=size))


@given(
    depth=st.integers(1, 5_000),
    opener=st.sampled_from(["[", "{", '{"a":', "[[{", "<tool_call>{", "<answer>["]),
    closed=st.booleans(),
    which=st.integers(0, len(ALL_DIALECTS) - 1),
)
def test_parse_never_raises_on_deep_nesting(
    depth: int, opener: str, closed: bool, which: int
) -> None:
    text = "<tool_call>" + opener * depth + ("]}" * depth if closed else "")
    _check(ALL_DIALECTS[which].parse(text))


@pytest.mark.parametrize(
    "text",
    [
        "x" * 1_000_000,
        "[" * 1_000_000,
        "{" * 1_000_000,
        "<tool_call>" * 100_000,
        "<tool_call>{" + '"a": "' * 200_000,
        "<thinking>"
        + "é" * 1_000_000
        + '</thinking><tool_call>{"name":"mobile_use","arguments":{"action":"wait"}}',
        '<tool_call>{"name": "mobile_use", "arguments": {"action": "type", "text": "'
        + "y" * 1_000_000
        + '"}}',
    ],
    ids=["text", "brackets", "braces", "tags", "quotes", "long-thought", "long-arg"],
)
def test_parse_never_raises_on_huge_inputs(text: str) -> None:
    for dialect in ALL_DIALECTS:
        _check(dialect.parse(text))
