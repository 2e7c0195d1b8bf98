"""``cua.agent.gym.kind: desktop`` from the Linux config: the gym it makes, its options checked
at load (no desktop is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cua_native.config import ConfigError, load_config
from cua_native.gym.desktop.gym import DesktopGym
from cua_native.gym.protocol import GymError
from cua_native.gym.server import load_gym
from cua_native.rollout.factories import make_gym

LINUX = Path(__file__).parents[3] / "configs" / "qwen3_vl_linux.yaml"


async def test_the_linux_config_runs_on_desktops_with_their_options() -> None:
    loaded = load_config(
        LINUX,
        overrides=[
            "cua.agent.gym.kind=desktop",
            "cua.agent.gym.options={width: 1024, height: 768, window_timeout_s: 90}",
        ],
    )
    gym = make_gym(loaded.cua.agent.gym)
    assert isinstance(gym, DesktopGym)
    assert (gym.local.width, gym.local.height, gym.window_timeout_s) == (1024, 768, 90)
    assert gym.gym_id == "linux"
    assert len(await gym.list_tasks()) == 38  # 34 on five apps, 4 infeasible
    await gym.aclose()


def test_an_option_the_desktop_gym_lacks_is_one_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="not options of a 'desktop' gym"):
        load_config(
            LINUX,
            overrides=["cua.agent.gym.kind=desktop", "cua.agent.gym.options={max_connections: 3}"],
        )


def _empty(directory: Path) -> bool:
    return not any(directory.iterdir())


async def test_a_missing_desktop_install_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    gym = DesktopGym(state_root=str(tmp_path), server_python=str(tmp_path / "no-python"))
    with pytest.raises(GymError, match=r"need .*no-python.*bash \.ci/desktop\.sh"):
        await gym.start(await gym.get_task("terminal_hello_file"))
    assert _empty(tmp_path)  # checked before anything was made


async def test_the_gym_server_loads_desktops_by_factory() -> None:
    gym = load_gym("cua_native.gym.desktop.gym:serve_desktops", seed=0)
    assert isinstance(gym, DesktopGym) and gym.gym_id == "desktop"
    await gym.aclose()


async def test_a_state_root_too_long_for_a_unix_socket_is_one_line(tmp_path: Path) -> None:
    root = tmp_path / ("x" * 80)
    gym = DesktopGym(state_root=str(root))
    with pytest.raises(GymError, match=r"too long for the server's Unix socket .*listen: tcp"):
        await gym.start(await gym.get_task("terminal_hello_file"))
    assert not root.exists()  # checked before anything was made
