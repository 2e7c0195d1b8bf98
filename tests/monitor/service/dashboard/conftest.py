"""A store filled with one realistic rollout: 3 turns with real PNG screenshots, actions click,
swipe and type, tokens with log-probs, and a validation."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

from cua_native.monitor.db.store import MonitorStore
from cua_native.monitor.screenshots import data_uri

SCREEN = (360, 640)
TOKEN = "s3cret-token"
ACTIONS: list[dict[str, Any]] = [
    {"type": "click", "x": 0.25, "y": 0.5},
    {"type": "swipe", "x": 0.5, "y": 0.8, "x2": 0.5, "y2": 0.2},
    {"type": "type", "text": "hello world"},
]


def render_screen(index: int) -> bytes:
    image = Image.new("RGB", SCREEN, (30 + 60 * index, 120, 200))
    draw = ImageDraw.Draw(image)
    draw.rectangle((20, 20, 340, 80), fill=(255, 255, 255))
    draw.text((30, 40), f"Screen {index + 1}", fill=(0, 0, 0))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def realistic_batch() -> dict[str, Any]:
    turns, actions, observations = [], [], []
    for index, action in enumerate(ACTIONS):
        turn_id = f"ro-1:{index + 1}"
        turns.append(
            {
                "client_id": turn_id,
                "rollout_client_id": "ro-1",
                "turn": index + 1,
                "turn_time": 1.5,
                "thinking": f"Step {index + 1}: I will {action['type']}.",
                "model_response": f"<thinking>...</thinking><tool_call>{action}</tool_call>",
                "metrics_json": {"stage_timings": {"generate": 0.8}},
            }
        )
        observations.append(
            {
                "client_id": f"{turn_id}:obs",
                "turn_client_id": turn_id,
                "obs_type": "screenshot",
                "screenshot_uri": data_uri(render_screen(index)),
                "width": SCREEN[0],
                "height": SCREEN[1],
            }
        )
        actions.append(
            {
                "client_id": f"{turn_id}:act",
                "turn_client_id": turn_id,
                "action_type": action["type"],
                "tool_name": "mobile_use",
                "tool_args": action,
                "tokens": ["<tool_call>", '{"action"', ": ", f'"{action["type"]}"', "}"],
                "logprobs": [-0.01, -0.2, -1.5, -3.0, -0.05],
                "num_tokens": 5,
            }
        )
    return {
        "training": {
            "client_id": "tr-1",
            "run_name": "demo-run",
            "log_path": "/tmp/demo",
            "model_name": "MAI-UI-2B",
            "status": "running",
            "total_steps": 10,
        },
        "tasks": [
            {
                "client_id": "task-wifi",
                "task_id": "wifi",
                "name": "Turn on Wi-Fi",
                "description": "Open settings and enable Wi-Fi",
            }
        ],
        "steps": [
            {
                "client_id": "step-0",
                "training_client_id": "tr-1",
                "step": 0,
                "status": "completed",
                "loss": 0.5,
                "kl_divergence": 0.01,
            }
        ],
        "rollouts": [
            {
                "client_id": "ro-1",
                "rollout_id": "0123456789abcdef",
                "step_client_id": "step-0",
                "task_client_id": "task-wifi",
                "model_path": "MAI-UI-2B",
                "group": 0,
                "max_turns": 5,
                "status": "completed",
                "reward": 1.0,
                "task_success": True,
                "parse_errors": 0,
            }
        ],
        "environments": [
            {
                "client_id": "ro-1:env",
                "rollout_client_id": "ro-1",
                "env_type": "sim",
                "status": "terminated",
            }
        ],
        "turns": turns,
        "actions": actions,
        "observations": observations,
        "validations": [
            {
                "client_id": "ro-1:val",
                "rollout_client_id": "ro-1",
                "success": True,
                "validation_query": "wifi_enabled",
                "expected_result": "true",
                "actual_result": "true",
                "details_json": {"reward": 1.0},
            }
        ],
    }


@pytest.fixture
def filled_store(tmp_path: Path) -> Iterator[tuple[MonitorStore, dict[str, Any]]]:
    store = MonitorStore.open(None, run_dir=tmp_path / "run")
    try:
        answer = store.ingest(realistic_batch())
        yield store, answer
    finally:
        store.close()
