"""Canonical action → adb shell argv, for every canonical action; a device test when
``CUA_ADB_SERIAL`` names one."""

from __future__ import annotations

import base64
import os

import pytest

from cua_native.actions.models import (
    ACTION_TYPES,
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
)
from cua_native.gym.adb import AdbDevice, UnsupportedOnDevice, adb_commands

W, H = 1080, 2400
APPS = {"Settings": "com.android.settings", "Chrome": "com.android.chrome"}

CASES = [
    (Click(x=0.5, y=0.25), [["input", "tap", "540", "600"]]),
    (
        DoubleClick(x=0.1, y=0.1),
        [["input", "tap", "108", "240"], ["sleep", "0.1"], ["input", "tap", "108", "240"]],
    ),
    (
        TripleClick(x=1.0, y=1.0),
        [["input", "tap", "1079", "2399"], ["sleep", "0.1"]] * 2
        + [["input", "tap", "1079", "2399"]],
    ),
    (LongPress(x=0.5, y=0.5), [["input", "swipe", "540", "1200", "540", "1200", "1000"]]),
    (
        LongPress(x=0.5, y=0.5, duration=2.5),
        [["input", "swipe", "540", "1200", "540", "1200", "2500"]],
    ),
    (Drag(x=0.1, y=0.2, x2=0.9, y2=0.8), [["input", "swipe", "108", "480", "972", "1920", "400"]]),
    # finger up from the centre: dy = -0.4 * W = -432 px
    (Swipe(direction="up"), [["input", "swipe", "540", "1200", "540", "768", "400"]]),
    (
        Swipe(direction="down", x=0.5, y=0.2),
        [["input", "swipe", "540", "480", "540", "912", "400"]],
    ),
    (Swipe(direction="left"), [["input", "swipe", "540", "1200", "324", "1200", "400"]]),
    (
        Swipe(direction="right", x=0.9, y=0.5),
        [["input", "swipe", "972", "1200", "1079", "1200", "400"]],
    ),
    (Swipe(x=0.5, y=0.9, x2=0.5, y2=0.1), [["input", "swipe", "540", "2160", "540", "240", "400"]]),
    # wheel up 600 px → finger moves down 600 px
    (Scroll(dy=600), [["input", "swipe", "540", "1200", "540", "1800", "400"]]),
    (Scroll(dx=216, x=0.5, y=0.5), [["input", "swipe", "540", "1200", "324", "1200", "400"]]),
    (TypeText(text="hello world"), [["input", "text", "hello%sworld"]]),
    (TypeText(text='it\'s $HOME & "q"'), [["input", "text", 'it\'s%s$HOME%s&%s"q"']]),
    (
        TypeText(text="a\nb"),
        [["input", "text", "a"], ["input", "keyevent", "KEYCODE_ENTER"], ["input", "text", "b"]],
    ),
    (TypeText(text=""), []),
    (Key(keys=["Enter"]), [["input", "keyevent", "KEYCODE_ENTER"]]),
    (Key(keys=["ctrl", "a"]), [["input", "keycombination", "KEYCODE_CTRL_LEFT", "KEYCODE_A"]]),
    (SystemButton(button="back"), [["input", "keyevent", "KEYCODE_BACK"]]),
    (SystemButton(button="home"), [["input", "keyevent", "KEYCODE_HOME"]]),
    (SystemButton(button="menu"), [["input", "keyevent", "KEYCODE_MENU"]]),
    (SystemButton(button="enter"), [["input", "keyevent", "KEYCODE_ENTER"]]),
    (
        OpenApp(name="settings"),
        [["monkey", "-p", "com.android.settings", "-c", "android.intent.category.LAUNCHER", "1"]],
    ),
    (
        OpenApp(name="org.example.app"),
        [["monkey", "-p", "org.example.app", "-c", "android.intent.category.LAUNCHER", "1"]],
    ),
    (Wait(seconds=2), []),
    (Terminate(status="success"), []),
    (Answer(text="42"), []),
    (AskUser(text="which one?"), []),
]

UNSUPPORTED = [
    RightClick(x=0.5, y=0.5),
    MiddleClick(x=0.5, y=0.5),
    MouseMove(x=0.5, y=0.5),
    ToolCall(name="search", arguments={"q": "x"}),
    Drag(x2=0.5, y2=0.5),
    Swipe(x=0.5, y=0.5),
    Scroll(),
    Key(keys=["hyper"]),
    OpenApp(name="Unknown App"),
    TypeText(text="héllo"),
]


@pytest.mark.parametrize(("action", "expected"), CASES, ids=lambda v: getattr(v, "type", ""))
def test_adb_commands(action, expected) -> None:
    assert adb_commands(action, W, H, APPS) == expected


@pytest.mark.parametrize("action", UNSUPPORTED, ids=lambda a: a.type)
def test_unsupported_actions_are_clear_errors(action) -> None:
    with pytest.raises(UnsupportedOnDevice):
        adb_commands(action, W, H, APPS)


def test_every_canonical_action_type_is_covered() -> None:
    covered = {a.type for a, _ in CASES} | {a.type for a in UNSUPPORTED}
    assert covered == set(ACTION_TYPES)


def test_unicode_text_goes_through_adb_keyboard() -> None:
    (command,) = adb_commands(TypeText(text="héllo 世界"), W, H, APPS, adb_keyboard=True)
    assert command[:6] == ["am", "broadcast", "-a", "ADB_INPUT_B64", "--es", "msg"]
    assert base64.b64decode(command[6]).decode("utf-8") == "héllo 世界"


@pytest.mark.skipif(not os.environ.get("CUA_ADB_SERIAL"), reason="CUA_ADB_SERIAL names no device")
async def test_real_device_screencap_and_tap() -> None:
    from cua_native.gym.wire import png_size

    device = AdbDevice(os.environ["CUA_ADB_SERIAL"])
    png = await device.screencap_png()
    width, height = png_size(png)
    assert width > 0 and height > 0
    for argv in adb_commands(SystemButton(button="home"), width, height, APPS):
        await device.shell(argv)
    for argv in adb_commands(Swipe(direction="up"), width, height, APPS):
        await device.shell(argv)
    assert png_size(await device.screencap_png()) == (width, height)


async def test_adb_gym_needs_a_device_serial_and_closes_what_it_started(toy, serve) -> None:
    from cua_native.gym.adb import AdbGym
    from cua_native.gym.http import HttpGym
    from cua_native.gym.protocol import GymError
    from cua_native.gym.server import create_app

    app = create_app({"toy": toy})
    async with serve(app) as url:
        gym = AdbGym(HttpGym(url, "toy"), app_packages=APPS)
        assert gym.gym_id == "toy" and len(await gym.list_tasks()) == 5
        with pytest.raises(GymError, match="device_serial"):
            await gym.start(await gym.get_task("task-001"))
        await gym.aclose()
        assert toy.close_calls == {"ex-1": 1}


async def test_adb_device_without_an_adb_server_is_a_gym_error() -> None:
    import socket

    from cua_native.gym.adb import AdbCommandError

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    device = AdbDevice("emulator-5554", port=port, command_timeout_s=2.0)
    with pytest.raises(AdbCommandError, match="emulator-5554"):
        await device.shell(["input", "tap", "1", "1"])


async def test_kind_adb_in_the_config_builds_an_adb_gym_on_the_server(toy, serve, tmp_path) -> None:
    from cua_native.config import load_config
    from cua_native.gym.adb import AdbGym
    from cua_native.gym.http import HttpGym
    from cua_native.gym.protocol import GymError
    from cua_native.gym.server import create_app
    from cua_native.rollout.factories import make_gym

    app = create_app({"toy": toy})
    async with serve(app) as url:
        config = tmp_path / "adb.yaml"
        config.write_text(
            "cua:\n  agent:\n    gym:\n      kind: adb\n"
            f"      base_url: {url}\n      gym_id: toy\n"
            "      adb:\n        port: 5038\n"
            "        app_packages: {Settings: com.android.settings}\n"
        )
        gym = make_gym(load_config(config).cua.agent.gym)
        assert isinstance(gym, AdbGym) and isinstance(gym.inner, HttpGym)
        assert (gym.adb_host, gym.adb_port) == ("127.0.0.1", 5038)
        assert gym.app_packages == {"Settings": "com.android.settings"}
        with pytest.raises(GymError, match="device_serial"):
            await gym.start(await gym.get_task("task-001"))
        await gym.aclose()
        assert toy.close_calls == {"ex-1": 1}
