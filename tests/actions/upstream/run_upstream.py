"""Run the vendored upstream parsers on one model output and describe what they read.

Each ``read_*`` function returns a JSON-able record: ``{"ok": true, "name": ..., "arguments":
{...}}`` for the first tool call upstream would execute (coordinates as upstream leaves them), or
``{"ok": false, "error": "<ExceptionType>: <message>"}`` when upstream raises or finds no call.
``agrees`` compares such a record with a canonical action (``docs/actions.md``), so a differential
corpus line can say which upstream reads the output the way cua_native does.
"""

from __future__ import annotations

import math
from typing import Any

import json5
import upstream_mai_ui
import upstream_mobileworld
import upstream_qwen3_vl_cookbook
from upstream_qwen_agent_nous import NousFnCallPrompt
from upstream_qwen_agent_schema import ContentItem, Message

UPSTREAMS = ("mai_ui", "mai_ui_grounding", "qwen_agent", "qwen3_vl_cookbook", "mobileworld")
"""Which upstream parser a record comes from (MAI-UI navigation and grounding are two parsers)."""


def _error(exc: BaseException) -> dict[str, Any]:
    return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:120]}"}


def read_mai_ui(text: str) -> dict[str, Any]:
    """MAI-UI's navigation agent: ``parse_action_to_structure_output`` (points divided by 999)."""
    try:
        parsed = upstream_mai_ui.parse_action_to_structure_output(text)
    except Exception as exc:  # upstream raises anything from ValueError to TypeError
        return _error(exc)
    return {
        "ok": True,
        "name": "mobile_use",
        "arguments": parsed["action_json"],
        "thought": parsed["thinking"],
    }


def read_mai_ui_grounding(text: str) -> dict[str, Any]:
    """MAI-UI's grounding agent: ``parse_grounding_response`` (point divided by 999)."""
    try:
        parsed = upstream_mai_ui.parse_grounding_response(text)
    except Exception as exc:
        return _error(exc)
    if parsed["coordinate"] is None:
        return {"ok": False, "error": "no <answer> block"}
    return {
        "ok": True,
        "name": "grounding",
        "arguments": {"action": "click", "coordinate": parsed["coordinate"]},
        "thought": parsed["thinking"],
    }


def read_qwen_agent(text: str) -> dict[str, Any]:
    """Qwen-Agent's ``NousFnCallPrompt.postprocess_fncall_messages``: the first function call.

    ``thought_in_content`` is set when the output holds ``</think>`` (what a Qwen-Agent user
    configures for a thinking model, whose chat template prefills ``<think>``).
    """
    message = Message(role="assistant", content=[ContentItem(text=text)])
    try:
        out = NousFnCallPrompt().postprocess_fncall_messages(
            [message], thought_in_content="</think>" in text
        )
    except Exception as exc:
        return _error(exc)
    for item in out:
        call = item.function_call
        if call is not None and call.name:
            try:
                arguments = json5.loads(call.arguments)
            except Exception as exc:
                return _error(exc)
            return {"ok": True, "name": call.name, "arguments": arguments}
    return {"ok": False, "error": "no function call"}


def read_qwen3_vl_cookbook(text: str) -> dict[str, Any]:
    """The Qwen3-VL mobile-agent notebook's one-line read of ``output_text``."""
    try:
        call = upstream_qwen3_vl_cookbook.parse_cookbook_output(text)
        return {"ok": True, "name": call["name"], "arguments": call["arguments"]}
    except Exception as exc:
        return _error(exc)


MOBILEWORLD_SCREEN = (1080, 2400)
"""Screen (width, height) MobileWorld's device-action mapping is run with (any size would do)."""


def read_mobileworld(text: str) -> dict[str, Any]:
    """MobileWorld's Qwen3-VL agent (``Qwen3VLAgentMCP.predict`` after the model call).

    ``parse_action_to_structure_output`` (points divided by 999; ``thinking`` and ``conclusion``
    from the ``Thought:``/``Action:`` lines), then for ``mobile_use`` the device-action mapping:
    an action it maps to nothing (``{}``: the device does nothing) or raises on is not read.
    Other tool names are MCP calls, passed on as they are.
    """
    try:
        parsed = upstream_mobileworld.parse_action_to_structure_output(text)
    except Exception as exc:  # upstream raises ValueError, TypeError, AttributeError …
        return _error(exc)
    record = {
        "ok": True,
        "name": parsed["action_name"],
        "arguments": parsed["action_json"],
        "thought": parsed["thinking"],
        "summary": parsed["conclusion"],
    }
    if parsed["action_name"] != "mobile_use":
        return record
    width, height = MOBILEWORLD_SCREEN
    try:
        device = upstream_mobileworld.parsing_response_to_andoid_world_env_action(
            parsed, height, width
        )
    except Exception as exc:
        return _error(exc)
    if not device:
        kind = parsed["action_json"].get("action")
        return {"ok": False, "error": f"no device action for {kind!r}"}
    return record


READERS = {
    "mai_ui": read_mai_ui,
    "mai_ui_grounding": read_mai_ui_grounding,
    "qwen_agent": read_qwen_agent,
    "qwen3_vl_cookbook": read_qwen3_vl_cookbook,
    "mobileworld": read_mobileworld,
}

# upstream action name -> canonical type, per the mapping of docs/actions.md
_TYPES = {
    "click": "click",
    "left_click": "click",
    "double_click": "double_click",
    "long_press": "long_press",
    "type": "type",
    "swipe": "swipe",
    "open": "open_app",
    "system_button": "system_button",
    "wait": "wait",
    "terminate": "terminate",
    "answer": "answer",
    "ask_user": "ask_user",
    "drag": "drag",
    "key": "key",
}
_POINTS = (
    ("coordinate", "x", "y"),
    ("start_coordinate", "x", "y"),
    ("end_coordinate", "x2", "y2"),
    ("coordinate2", "x2", "y2"),
)


def agrees(
    record: dict[str, Any],
    expect: dict[str, Any],
    *,
    grid: float | None,
    summary: str | None = None,
) -> bool:
    """Whether upstream's record reads the same action as ``expect`` (a canonical action JSON).

    ``grid``: the scale upstream's raw coordinates are on (Qwen-Agent, the cookbook: 999);
    ``None`` when upstream already divided them (MAI-UI, MobileWorld). Compared: the action type,
    the points (within half a grid step) and the text of ``type``/``answer``/``open``; for an
    upstream that reads the ``Action:`` line (MobileWorld's ``conclusion``, which goes into its
    history) and a case that gives the ``summary`` expected, that line too.
    """
    if "error" in expect:
        return not record["ok"]
    if not record["ok"]:
        return False
    if "summary" in record and summary is not None and record["summary"] != summary:
        return False
    if expect["type"] == "tool_call":
        return record["name"] == expect["name"] and record["arguments"] == expect["arguments"]
    args = record["arguments"]
    if record["name"] not in ("mobile_use", "computer_use", "grounding"):
        return False
    if _TYPES.get(str(args.get("action"))) != expect["type"]:
        return False
    for key, xf, yf in _POINTS:
        if key not in args or expect.get(xf) is None:
            continue
        point = args[key]
        if len(point) != 2:
            return False
        scale = grid or 1.0
        if not (
            math.isclose(point[0] / scale, expect[xf], abs_tol=0.5 / 999)
            and math.isclose(point[1] / scale, expect[yf], abs_tol=0.5 / 999)
        ):
            return False
    text_of = {"type": "text", "answer": "text", "open_app": "name", "ask_user": "text"}
    field = text_of.get(expect["type"])
    return field is None or args.get("text") == expect[field]
