"""JSON ⇄ protocol types, shared by the gym server and the HTTP client (``docs/gym_protocol.md``).

Screenshots travel as ``{"png_base64": ...}`` or ``{"url": ...}``. PNG encoding of an in-memory
image is CPU work, so the async helpers run it in a thread; the sync helpers are for callers that
are already off the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from PIL.Image import Image as PILImage

from cua_native.gym.media import check_url_allowed
from cua_native.gym.protocol import (
    Evaluation,
    Observation,
    Screenshot,
    StepResult,
    Task,
    ValidatorResult,
    reward_from_result,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class WireError(ValueError):
    """A JSON document does not have the shape the gym protocol requires."""


def encode_png(image: PILImage, compress_level: int = 1) -> bytes:
    """Lossless PNG bytes of ``image`` (level 1: a phone screenshot encodes ~5x faster than 6)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=compress_level)
    return buffer.getvalue()


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG header, without decoding the pixels."""
    if len(data) < 24 or not data.startswith(PNG_SIGNATURE) or data[12:16] != b"IHDR":
        raise WireError("not a PNG image")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def screenshot_to_json_sync(shot: Screenshot, compress_level: int = 1) -> dict[str, str]:
    if shot.url is not None:
        return {"url": shot.url}
    data = shot.png if shot.png is not None else encode_png(_image_of(shot), compress_level)
    return {"png_base64": base64.b64encode(data).decode("ascii")}


def observation_to_json_sync(obs: Observation, compress_level: int = 1) -> dict[str, Any]:
    return {
        "screenshot": screenshot_to_json_sync(obs.screenshot, compress_level),
        "width": obs.width,
        "height": obs.height,
        "turn": obs.turn,
    }


async def observation_to_json(obs: Observation, compress_level: int = 1) -> dict[str, Any]:
    """``observation_to_json_sync`` in a worker thread (PNG encode + base64 off the loop)."""
    return await asyncio.to_thread(observation_to_json_sync, obs, compress_level)


def step_result_to_json_sync(result: StepResult, compress_level: int = 1) -> dict[str, Any]:
    body: dict[str, Any] = {"ok": result.ok, "error": result.error}
    if result.feedback is not None:
        body["feedback"] = result.feedback
    if result.observation is not None:
        body["observation"] = observation_to_json_sync(result.observation, compress_level)
    return body


async def step_result_to_json(result: StepResult, compress_level: int = 1) -> dict[str, Any]:
    return await asyncio.to_thread(step_result_to_json_sync, result, compress_level)


def screenshot_from_json(data: Any, allowed_media_domains: Sequence[str]) -> Screenshot:
    """Inline PNG → ``Screenshot(png=...)``; URL → ``Screenshot(url=...)`` after the allow-list
    check of scheme and host (DNS is checked when the URL is fetched, see ``media``)."""
    if not isinstance(data, Mapping):
        raise WireError(f"screenshot must be an object, got {type(data).__name__}")
    if isinstance(data.get("png_base64"), str):
        try:
            png = base64.b64decode(data["png_base64"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise WireError(f"screenshot.png_base64 is not valid base64: {exc}") from exc
        if not png:
            raise WireError("screenshot.png_base64 is empty")
        return Screenshot(png=png)
    if isinstance(data.get("url"), str):
        try:
            check_url_allowed(data["url"], allowed_media_domains)
        except ValueError as exc:
            raise WireError(f"screenshot.url refused: {exc}") from exc
        return Screenshot(url=data["url"])
    raise WireError("screenshot needs a 'png_base64' or a 'url' string")


def observation_from_json(data: Any, allowed_media_domains: Sequence[str] = ()) -> Observation:
    if not isinstance(data, Mapping):
        raise WireError(f"observation must be an object, got {type(data).__name__}")
    shot = screenshot_from_json(data.get("screenshot"), allowed_media_domains)
    width, height = data.get("width"), data.get("height")
    if not _is_int(width) or not _is_int(height):
        if shot.png is None:
            raise WireError("observation needs integer 'width' and 'height'")
        width, height = png_size(shot.png)
    turn = data.get("turn", 0)
    return Observation(shot, int(width), int(height), int(turn) if _is_int(turn) else 0)


def step_result_from_json(data: Any, allowed_media_domains: Sequence[str] = ()) -> StepResult:
    if not isinstance(data, Mapping) or not isinstance(data.get("ok"), bool):
        raise WireError("an action answer needs a boolean 'ok'")
    error = data.get("error")
    feedback = data.get("feedback")
    obs = data.get("observation")
    return StepResult(
        ok=data["ok"],
        error=None if error is None else str(error),
        observation=None if obs is None else observation_from_json(obs, allowed_media_domains),
        feedback=None if feedback is None else str(feedback),
    )


def evaluation_to_json(evaluation: Evaluation) -> dict[str, Any]:
    """genv's evaluate answer: ``{"success", "result": {"score", "success", "validators"}}``."""
    return {
        "success": evaluation.success,
        "result": {
            "score": evaluation.reward,
            "success": evaluation.success,
            "validators": [v.to_json() for v in evaluation.validators],
        },
    }


def evaluation_from_json(data: Any) -> Evaluation:
    """Reward by the spec's rule (``reward_from_result``); legacy top-level ``score``/``reward``
    are used only when ``result`` carries neither a score nor validators."""
    if not isinstance(data, Mapping):
        raise WireError(f"evaluation must be an object, got {type(data).__name__}")
    result = data.get("result")
    result = dict(result) if isinstance(result, Mapping) else {}
    top_success = data.get("success")
    success = top_success if isinstance(top_success, bool) else result.get("success")
    success = success if isinstance(success, bool) else None
    if "score" not in result and not result.get("validators"):
        for key in ("score", "reward"):
            if _is_number(data.get(key)):
                result["score"] = data[key]
                break
    reward = reward_from_result(result, success)
    validators = tuple(
        ValidatorResult(
            id=str(v.get("id", i)),
            passed=bool(v.get("pass", v.get("passed", False))),
            score=float(v["score"]) if _is_number(v.get("score")) else float(bool(v.get("pass"))),
            weight=float(v["weight"]) if _is_number(v.get("weight")) else 1.0,
            message=str(v.get("message") or ""),
        )
        for i, v in enumerate(result.get("validators") or [])
        if isinstance(v, Mapping)
    )
    return Evaluation(
        reward=reward,
        success=bool(success) if success is not None else reward >= 1.0,
        validators=validators,
        raw=dict(data),
    )


def task_from_json(data: Any) -> Task:
    """A gym task; the identifier falls back to ``id`` then ``meta.id`` (genv summaries)."""
    if not isinstance(data, Mapping):
        raise WireError(f"task must be an object, got {type(data).__name__}")
    fields = dict(data)
    raw_meta = fields.get("meta")
    meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
    if not fields.get("task_id"):
        ident = fields.get("id") or meta.get("id")
        if ident is None or ident == "":
            raise WireError("task has no 'task_id', 'id' or 'meta.id'")
        fields["task_id"] = str(ident)
    for key, fallback in (("name", meta.get("name")), ("description", meta.get("description"))):
        if not fields.get(key) and isinstance(fallback, str):
            fields[key] = fallback
    if isinstance(fields.get("tags"), str):
        fields["tags"] = [t.strip() for t in fields["tags"].split(",") if t.strip()]
    try:
        return Task.model_validate(fields)
    except ValueError as exc:
        raise WireError(f"invalid task {fields.get('task_id')!r}: {exc}") from exc


def task_to_json(task: Task) -> dict[str, Any]:
    return task.model_dump(mode="json")


def tasks_from_json(data: Any) -> list[Task]:
    """``{"tasks": [...]}`` or a bare list."""
    items = data.get("tasks") if isinstance(data, Mapping) else data
    if not isinstance(items, list):
        raise WireError("task list must be {'tasks': [...]} or a JSON list")
    return [task_from_json(item) for item in items]


def _image_of(shot: Screenshot) -> PILImage:
    assert shot.image is not None
    return shot.image


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
