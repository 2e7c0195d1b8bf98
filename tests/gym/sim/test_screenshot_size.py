"""``SimGym(screenshot_size=...)``: smaller screenshots, the same screen and the same tasks."""

from __future__ import annotations

import pytest

from cua_native.gym.sim import SimGym


async def test_screenshots_at_another_size_keep_screen_coordinates() -> None:
    small = SimGym(screenshot_size=(160, 384))
    execution = await small.start(await small.get_task("sim-001"))
    observation = await execution.observe()
    assert observation.screenshot.image is not None
    assert observation.screenshot.image.size == (160, 384)
    assert (observation.width, observation.height) == (1080, 2400)
    await execution.close()


@pytest.mark.parametrize("task_id", ["sim-001", "sim-010", "sim-020", "sim-030"])
async def test_solutions_still_solve_at_a_small_size(task_id: str) -> None:
    small = SimGym(screenshot_size=(160, 384))
    execution = await small.start(await small.get_task(task_id))
    try:
        await execution.play_solution()
        assert (await execution.evaluate()).success
    finally:
        await execution.close()


async def test_small_frames_show_the_same_screen_as_full_ones() -> None:
    """Downscaled, a full-size frame and a small one agree on the screen's layout (the light
    background and the dark app-icon row sit in the same places)."""
    full, small = SimGym(), SimGym(screenshot_size=(270, 600))
    task = await full.get_task("sim-001")
    frames = []
    for gym in (full, small):
        execution = await gym.start(task)
        shot = (await execution.observe()).screenshot.image
        assert shot is not None
        frames.append(shot.convert("L").resize((27, 60)))
        await execution.close()
    a, b = (list(f.tobytes()) for f in frames)
    mean_abs = sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)
    assert mean_abs < 12


@pytest.mark.parametrize("size", [(0, 100), (20, 20), (100, 10_000)])
def test_bad_screenshot_sizes_are_refused(size: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="screenshot_size"):
        SimGym(screenshot_size=size)


def test_sizes_parse_from_the_command_line_form() -> None:
    from cua_native.gym.sim.gym import parse_size

    assert parse_size("160x384") == (160, 384)
    with pytest.raises(ValueError, match="WIDTHxHEIGHT"):
        parse_size("160 by 384")
