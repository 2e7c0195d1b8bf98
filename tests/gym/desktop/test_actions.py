"""Canonical action → OSWorld-style /execute commands (pure)."""

from __future__ import annotations

import pytest

from cua_native.actions.models import (
    Answer,
    Click,
    Drag,
    Key,
    RightClick,
    Scroll,
    Swipe,
    SystemButton,
    TypeText,
)
from cua_native.gym.desktop.actions import (
    PYAUTOGUI_PREFIX,
    UnsupportedOnDesktop,
    desktop_commands,
    pyautogui_key,
)


def _call(argv: list[str]) -> str:
    assert argv[:2] == ["python", "-c"]
    prefix = PYAUTOGUI_PREFIX.format(command="")
    assert argv[2].startswith(prefix)
    return argv[2][len(prefix) :]


def test_points_are_real_screen_pixels() -> None:
    [argv] = desktop_commands(Click(x=0.5, y=0.25), 1920, 1080)
    assert _call(argv) == "pyautogui.click(960, 270)"
    [argv] = desktop_commands(RightClick(x=1.0, y=1.0), 1280, 800)
    assert _call(argv) == "pyautogui.rightClick(1279, 799)"


def test_drag_and_swipe_with_an_end_point() -> None:
    [argv] = desktop_commands(Drag(x=0.0, y=0.0, x2=0.5, y2=0.5), 100, 100)
    assert (
        _call(argv)
        == "pyautogui.moveTo(0, 0); pyautogui.dragTo(50, 50, duration=0.5, button='left')"
    )
    with pytest.raises(UnsupportedOnDesktop):
        desktop_commands(Swipe(direction="up"), 100, 100)


def test_keys_are_pyautogui_names_and_unknown_keys_are_refused() -> None:
    [argv] = desktop_commands(Key(keys=["Control", "Shift", "N"]), 100, 100)
    assert _call(argv) == "pyautogui.hotkey('ctrl', 'shift', 'n')"
    [argv] = desktop_commands(Key(keys=["Return"]), 100, 100)
    assert _call(argv) == "pyautogui.press('enter')"
    assert pyautogui_key("F5") == "f5"
    with pytest.raises(UnsupportedOnDesktop):
        pyautogui_key("hyperdrive")
    with pytest.raises(UnsupportedOnDesktop):
        desktop_commands(SystemButton(button="home"), 100, 100)


def test_ascii_text_is_typed_by_pyautogui_and_unicode_by_xdotool() -> None:
    [argv] = desktop_commands(TypeText(text="a'b\n"), 100, 100)
    assert _call(argv) == 'pyautogui.write("a\'b\\n", interval=0.01)'
    assert desktop_commands(TypeText(text="Köln"), 100, 100) == [
        ["xdotool", "type", "--delay", "12", "--", "Köln"]
    ]
    assert desktop_commands(TypeText(text="wc -l < a"), 100, 100) == [
        ["xdotool", "type", "--delay", "12", "--", "wc -l < a"]  # pyautogui would type '>'
    ]
    assert desktop_commands(TypeText(text=""), 100, 100) == []


def test_scroll_clicks_at_a_point_and_capped() -> None:
    [argv] = desktop_commands(Scroll(dy=-3, x=0.5, y=0.5), 200, 100)
    assert _call(argv) == "pyautogui.scroll(-3, x=100, y=50)"
    [argv] = desktop_commands(Scroll(dx=500), 200, 100)
    assert _call(argv) == "pyautogui.hscroll(50)"


def test_episode_control_actions_do_nothing_on_the_desktop() -> None:
    assert desktop_commands(Answer(text="done"), 100, 100) == []
