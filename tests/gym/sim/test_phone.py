"""Canonical actions on the simulated phone: every type on every screen, gestures, typing."""

from __future__ import annotations

import pytest

from cua_native.actions import models as m
from cua_native.gym.sim import SimExecution, SimGym
from cua_native.gym.sim.layout import centre_unit
from cua_native.gym.sim.screens import PAGES, build_layout, screen_for
from cua_native.gym.sim.state import Screen

EVERY_ACTION: list[m.Action] = [
    m.Click(x=0.5, y=0.3),
    m.DoubleClick(x=0.5, y=0.15),
    m.TripleClick(x=0.5, y=0.2),
    m.RightClick(x=0.5, y=0.5),
    m.MiddleClick(x=0.5, y=0.5),
    m.MouseMove(x=0.2, y=0.2),
    m.LongPress(x=0.5, y=0.2),
    m.LongPress(x=0.5, y=0.2, duration=2.0),
    m.Drag(x=0.1, y=0.19, x2=0.9, y2=0.19),
    m.Drag(x2=0.5, y2=0.1),
    m.Swipe(direction="up"),
    m.Swipe(direction="left", x=0.5, y=0.5),
    m.Swipe(x=0.5, y=0.8, x2=0.5, y2=0.3),
    m.Scroll(dy=-300),
    m.Scroll(dx=50, x=0.5, y=0.5),
    m.TypeText(text="hello\nworld"),
    m.Key(keys=["enter"]),
    m.Key(keys=["ctrl", "a"]),
    m.Key(keys=["a"]),
    m.Key(keys=["backspace"]),
    m.SystemButton(button="menu"),
    m.SystemButton(button="enter"),
    m.SystemButton(button="back"),
    m.SystemButton(button="home"),
    m.OpenApp(name="Settings"),
    m.OpenApp(name="no such app"),
    m.Wait(),
    m.Wait(seconds=2),
    m.AskUser(text="Which one?"),
    m.ToolCall(name="search", arguments={"q": "x"}),
    m.Answer(text="42"),
    m.Terminate(status="failure"),
]


def _page_stack(execution: SimExecution, app: str, page: str) -> list[Screen]:
    state = execution.state
    arg = {
        ("contacts", "detail"): state.contacts[0].name,
        ("shop", "item"): "3",
        ("notes", "edit"): str(state.notes[0].note_id),
    }.get((app, page))
    return (
        [Screen("home", "main"), screen_for(app, page, arg)]
        if app != "home"
        else [Screen("home", "main")]
    )


@pytest.mark.parametrize("page", sorted(PAGES), ids=lambda p: "/".join(p))
async def test_every_action_on_every_screen(small_gym: SimGym, page: tuple[str, str]) -> None:
    execution = await small_gym.start(await small_gym.get_task("sim-001"))
    for action in EVERY_ACTION:
        execution.state.stack = _page_stack(execution, *page)
        execution.state.menu = None
        result = await execution.act(action)
        refused = action.type == "tool_call"
        assert result.ok is not refused, (action, result.error)
        assert (result.error is not None) is refused
        observation = await execution.observe()
        assert observation.screenshot.image is not None
        assert observation.screenshot.image.size == (270, 600)
    await execution.close()


async def test_every_action_with_a_menu_open(small_gym: SimGym) -> None:
    execution = await small_gym.start(await small_gym.get_task("sim-024"))
    await execution.act(m.OpenApp(name="notes"))
    row = build_layout(execution.state).by_id(f"note:{execution.state.notes[0].note_id}")
    assert row is not None
    for action in EVERY_ACTION:
        await execution.act(m.OpenApp(name="notes"))
        assert (await execution.act(m.LongPress(x=centre_unit(row)[0], y=centre_unit(row)[1]))).ok
        assert execution.state.menu is not None
        await execution.act(action)
        await execution.observe()
    await execution.close()


async def _shop(gym: SimGym) -> SimExecution:
    execution = await gym.start(await gym.get_task("sim-026"))
    await execution.act(m.OpenApp(name="shop"))
    return execution


def _first_row(execution: SimExecution) -> str:
    layout = build_layout(execution.state)
    return next(e.label for e in layout.elements if e.id.startswith("item:") and e.fully_visible)


async def test_swipe_is_the_finger_direction(small_gym: SimGym) -> None:
    execution = await _shop(small_gym)
    top = _first_row(execution)
    await execution.act(m.Swipe(direction="up"))  # finger up: later items come into view
    scrolled = execution.state.screen.scroll
    assert scrolled > 0 and _first_row(execution) > top
    await execution.act(m.Swipe(direction="down"))
    assert execution.state.screen.scroll == 0 and _first_row(execution) == top
    await execution.act(m.Swipe(x=0.5, y=0.8, x2=0.5, y2=0.3))
    assert execution.state.screen.scroll == pytest.approx(0.5 * 2400)
    await execution.act(m.Swipe(direction="down", x=0.5, y=0.3))  # never past the top
    await execution.act(m.Swipe(direction="down", x=0.5, y=0.3))
    assert execution.state.screen.scroll == 0


async def test_wheel_scroll_positive_dy_moves_the_view_up(small_gym: SimGym) -> None:
    execution = await _shop(small_gym)
    await execution.act(m.Scroll(dy=-100))  # 100 px of a 600 px high screen
    assert execution.state.screen.scroll == pytest.approx(400)
    await execution.act(m.Scroll(dy=50))
    assert execution.state.screen.scroll == pytest.approx(200)
    await execution.act(m.Scroll(dy=-100_000))
    layout = build_layout(execution.state)
    assert execution.state.screen.scroll == layout.max_scroll  # clamped at the end


async def test_typing_into_fields(gym: SimGym) -> None:
    execution = await gym.start(await gym.get_task("sim-018"))
    await execution.act(m.TypeText(text="ignored"))  # nothing focused on the home screen
    await execution.act(m.OpenApp(name="phone book"))  # a synonym
    assert execution.state.screen.app == "contacts"
    add = build_layout(execution.state).find("Add contact")
    assert add is not None
    await execution.act(m.Click(x=centre_unit(add)[0], y=centre_unit(add)[1]))
    assert execution.state.focus == "field:name"
    await execution.act(m.TypeText(text="Ann Lee"))
    await execution.act(m.Key(keys=["enter"]))  # moves to the phone field
    await execution.act(m.TypeText(text="5551"))
    await execution.act(m.Key(keys=["backspace"]))
    assert execution.state.fields == {"field:name": "Ann Lee", "field:phone": "555"}
    await execution.act(m.SystemButton(button="enter"))  # submits the form
    contact = execution.state.contact("Ann Lee")
    assert contact is not None and contact.phone == "555"
    assert execution.state.screen.key == ("contacts", "list")


async def test_open_app_back_and_home(gym: SimGym) -> None:
    execution = await gym.start(await gym.get_task("sim-001"))
    assert (await execution.act(m.OpenApp(name="Photoshop"))).ok  # unknown: a no-op
    assert execution.state.screen.key == ("home", "main")
    await execution.act(m.OpenApp(name="SETTINGS"))
    display = build_layout(execution.state).find("Display")
    assert display is not None
    await execution.act(m.Click(x=centre_unit(display)[0], y=centre_unit(display)[1]))
    assert execution.state.screen.key == ("settings", "display")
    await execution.act(m.SystemButton(button="back"))
    assert execution.state.screen.key == ("settings", "main")
    await execution.act(m.Key(keys=["home"]))
    assert execution.state.screen.key == ("home", "main")


async def test_taps_on_a_toggle(gym: SimGym) -> None:
    execution = await gym.start(await gym.get_task("sim-001"))
    await execution.act(m.OpenApp(name="settings"))
    wifi = build_layout(execution.state).find("Wi-Fi")
    assert wifi is not None
    x, y = centre_unit(wifi)
    before = execution.state.wifi_on
    await execution.act(m.DoubleClick(x=x, y=y))
    assert execution.state.wifi_on == before
    await execution.act(m.TripleClick(x=x, y=y))
    assert execution.state.wifi_on != before
    await execution.act(m.RightClick(x=x, y=y))
    await execution.act(m.MouseMove(x=x, y=y))
    assert execution.state.wifi_on != before


async def test_drag_moves_the_brightness_slider(gym: SimGym) -> None:
    execution = await gym.start(await gym.get_task("sim-009"))
    execution.state.stack = [Screen("home", "main"), Screen("settings", "display")]
    slider = build_layout(execution.state).by_id("slider:brightness")
    assert slider is not None
    x0, y0, x1, y1 = slider.box
    knob = (x0 + (x1 - x0) * execution.state.brightness / 100) / 1080
    y = (y0 + y1) / 2 / 2400
    await execution.act(m.Drag(x=knob, y=y, x2=0.99, y2=y))
    assert execution.state.brightness == 100
    await execution.act(m.Swipe(x=0.99 * x1 / 1080, y=y, x2=0.0, y2=y))
    assert execution.state.brightness == 0


async def test_long_press_deletes_a_note_through_its_menu(gym: SimGym) -> None:
    execution = await gym.start(await gym.get_task("sim-024"))
    await execution.act(m.OpenApp(name="notes"))
    note = execution.state.notes[0]
    row = build_layout(execution.state).by_id(f"note:{note.note_id}")
    assert row is not None
    await execution.act(m.LongPress(x=centre_unit(row)[0], y=centre_unit(row)[1]))
    delete = build_layout(execution.state).find("Delete note")
    assert delete is not None
    await execution.act(m.Click(x=centre_unit(delete)[0], y=centre_unit(delete)[1]))
    assert execution.state.note(note.note_id) is None and execution.state.menu is None


async def test_ask_user_and_tool_call(gym: SimGym) -> None:
    execution = await gym.start(await gym.get_task("sim-001"))
    reply = await execution.act(m.AskUser(text="Which network?"))
    assert reply.ok and reply.feedback == gym.user_reply
    refused = await execution.act(m.ToolCall(name="search"))
    assert not refused.ok and refused.error and "search" in refused.error
    unknown = await execution.act(m.Key(keys=["f13"]))
    assert not unknown.ok and unknown.error
