"""Wire encoding round trips, evaluation reward rules, fault profiles."""

from __future__ import annotations

import base64
import json
from io import BytesIO
from pathlib import Path

import pytest
from PIL import Image

from cua_native.gym.faults import FaultInjector, FaultProfile, FaultProfileError
from cua_native.gym.protocol import Evaluation, Observation, Screenshot, StepResult, ValidatorResult
from cua_native.gym.wire import (
    WireError,
    evaluation_from_json,
    evaluation_to_json,
    observation_from_json,
    observation_to_json,
    png_size,
    step_result_from_json,
    step_result_to_json,
    tasks_from_json,
)


async def test_observation_round_trip_keeps_pixels() -> None:
    image = Image.new("RGB", (31, 57), (1, 2, 3))
    image.putpixel((30, 56), (250, 0, 9))
    data = await observation_to_json(Observation(Screenshot(image=image), 31, 57, turn=4))
    obs = observation_from_json(json.loads(json.dumps(data)))
    assert (obs.width, obs.height, obs.turn) == (31, 57, 4) and png_size(obs.screenshot.png) == (
        31,
        57,
    )
    decoded = Image.open(BytesIO(obs.screenshot.png)).convert("RGB")
    assert decoded.tobytes() == image.tobytes()
    step = await step_result_to_json(
        StepResult(ok=False, error="no", feedback="hi", observation=obs)
    )
    back = step_result_from_json(step)
    assert (back.ok, back.error, back.feedback) == (False, "no", "hi")
    assert back.observation is not None and back.observation.screenshot.png == obs.screenshot.png


def test_observation_urls_and_errors() -> None:
    shot = {"url": "https://shots.example.com/a.png"}
    obs = observation_from_json(
        {"screenshot": shot, "width": 5, "height": 6}, ["shots.example.com"]
    )
    assert obs.screenshot.url == shot["url"]
    with pytest.raises(WireError, match="refused"):
        observation_from_json({"screenshot": shot, "width": 5, "height": 6}, ["other.com"])
    with pytest.raises(WireError, match="base64"):
        observation_from_json({"screenshot": {"png_base64": "!!"}, "width": 1, "height": 1})
    with pytest.raises(WireError, match="png_base64"):
        observation_from_json({"screenshot": {}, "width": 1, "height": 1})
    with pytest.raises(WireError, match="width"):
        observation_from_json({"screenshot": shot}, ["shots.example.com"])
    # width/height may be omitted with an inline PNG: read from the header
    png = Image.new("RGB", (7, 9))
    buf = BytesIO()
    png.save(buf, "PNG")
    inline = {"png_base64": base64.b64encode(buf.getvalue()).decode()}
    assert observation_from_json({"screenshot": inline}).width == 7
    with pytest.raises(WireError, match="boolean 'ok'"):
        step_result_from_json({"error": None})


def test_evaluation_reward_rules() -> None:
    # a real score of 0 stays 0, even with success: true
    zero = evaluation_from_json({"success": True, "result": {"score": 0, "success": True}})
    assert zero.reward == 0.0 and zero.success
    weighted = evaluation_from_json(
        {
            "success": False,
            "result": {
                "validators": [
                    {"id": "a", "pass": True, "score": 1.0, "weight": 3},
                    {"id": "b", "pass": False, "score": 0.0, "weight": 1},
                ]
            },
        }
    )
    assert weighted.reward == 0.75 and [v.passed for v in weighted.validators] == [True, False]
    assert evaluation_from_json({"success": True}).reward == 1.0
    assert evaluation_from_json({"success": False, "reward": 0.4}).reward == 0.4
    assert evaluation_from_json({"result": {}}).reward == 0.0
    with pytest.raises(WireError):
        evaluation_from_json([1])
    original = Evaluation(0.5, False, (ValidatorResult("v", False, 0.5, 2.0, "half"),))
    again = evaluation_from_json(evaluation_to_json(original))
    assert (again.reward, again.success, again.validators) == (0.5, False, original.validators)


def test_task_lists() -> None:
    assert [t.task_id for t in tasks_from_json([{"id": 5}, {"task_id": "x"}])] == ["5", "x"]
    assert tasks_from_json({"tasks": []}) == []
    with pytest.raises(WireError, match="task list"):
        tasks_from_json({"items": []})


def test_fault_profile_loading_and_determinism(tmp_path: Path) -> None:
    inline = '{"seed": 4, "error_share": {"*": 0.5}, "drop_share": {"actions": 0.3}}'
    profile = FaultProfile.load(inline)
    path = tmp_path / "faults.yaml"
    path.write_text("seed: 4\nerror_share: {'*': 0.5}\ndrop_share: {actions: 0.3}\n")
    assert FaultProfile.load(path) == profile
    first = FaultInjector(profile).decide("actions")
    a, b = FaultInjector(profile), FaultInjector(profile)
    seq_a = [a.decide("actions") for _ in range(200)]
    seq_b = [b.decide("actions") for _ in range(200)]
    assert seq_a == seq_b and seq_a[0] == first
    errors = sum(d.error for d in seq_a) / 200
    drops = sum(d.drop for d in seq_a) / 200
    assert 0.35 < errors < 0.65 and 0.15 < drops < 0.45
    assert not any(FaultInjector(profile).decide("observation").drop for _ in range(50))
    with pytest.raises(
        FaultProfileError, match=r'error_share: unknown route "nope" \(routes: list'
    ):
        FaultProfile.load('{"error_share": {"nope": 1}}')
    with pytest.raises(FaultProfileError, match="neither inline JSON"):
        FaultProfile.load(tmp_path / "missing.yaml")
    with pytest.raises(FaultProfileError, match=r"drop_share\.actions: .*less than or equal to 1"):
        FaultProfile.load('{"drop_share": {"actions": 1.5}}')
