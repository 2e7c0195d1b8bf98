"""Qwen3-VL prompts: the Hermes ``# Tools`` system text with a GUI tool, and step summaries.

Sources (all Apache-2.0): QwenLM/Qwen3-VL@9658872 ``cookbooks/mobile_agent.ipynb`` (hand-written
system prompt, user query, "Step i:" history) and ``cookbooks/utils/agent_function_call.py``
(``MobileUse``/``ComputerUse`` schemas); Tongyi-MAI/MobileWorld@6a4dec2 ``agents/utils/prompts.py``
and ``implementations/qwen3vl.py`` (ask_user schema, user template, feedback suffixes).

The system text is written by hand, as the cookbooks do, not through the chat template's
``tools`` argument: the tool JSON is ``json.dumps(tool, ensure_ascii=False)`` of
``{"type": "function", "function": {...}}`` (Qwen-Agent's spacing), and with the default
``system_preamble=""`` the text starts with ``"\\n\\n# Tools"`` exactly like the notebook.

User turn: the query text, then the kept past screenshots (oldest first; only with
``history_images > 1``), then the current screenshot. Each past turn is one "Step i: …; "
entry: the model's ``Action:`` line (``ParsedOutput.summary``), else the tool-call JSON the
dialect writes for the action, plus MobileWorld-style suffixes for feedback. Dropped turns keep
their numbers off the list: the remaining steps keep their original ``i``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from cua_native.actions.dialects import Dialect
from cua_native.actions.models import AskUser, ToolCall
from cua_native.gym.protocol import Task
from cua_native.prompts.config import PromptConfig
from cua_native.prompts.history import HistoryStep, HistoryWindow, format_past_action
from cua_native.prompts.images import ImageUrl, PreparedImage, message_url

_POINT = (
    "(x, y): The x (pixels from the left edge) and y (pixels from the top edge) coordinates "
    "to move the mouse to."
)
_BUTTON = (
    "Back means returning to the previous interface, Home means returning to the desktop, "
    "Menu means opening the application background menu, and Enter means pressing the enter. "
    "Required only by `action=system_button`"
)
_STATUS = {
    "description": "The status of the task. Required only by `action=terminate`.",
    "type": "string",
    "enum": ["success", "failure"],
}

_MOBILE_ACTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "mobile_use_utils": (
        (
            "key",
            "Perform a key event on the mobile device.\n    - This supports adb's `keyevent` "
            'syntax.\n    - Examples: "volume_up", "volume_down", "power", "camera", "clear".',
        ),
        ("click", "Click the point on the screen with coordinate (x, y)."),
        (
            "long_press",
            "Press the point on the screen with coordinate (x, y) for specified seconds.",
        ),
        (
            "swipe",
            "Swipe from the starting point with coordinate (x, y) to the end point with "
            "coordinates2 (x2, y2).",
        ),
        ("type", "Input the specified text into the activated input box."),
        ("system_button", "Press the system button."),
        ("open", "Open an app on the device."),
        ("wait", "Wait specified seconds for the change to happen."),
        ("terminate", "Terminate the current task and report its completion status."),
    ),
    "mobile_use_notebook": (
        ("click", "Click the point on the screen with coordinate (x, y)."),
        (
            "long_press",
            "Press the point on the screen with coordinate (x, y) for specified seconds.",
        ),
        (
            "swipe",
            "Swipe from the starting point with coordinate (x, y) to the end point with "
            "coordinates2 (x2, y2).",
        ),
        ("type", "Input the specified text into the activated input box."),
        ("answer", "Output the answer."),
        ("system_button", "Press the system button."),
        ("wait", "Wait specified seconds for the change to happen."),
        ("terminate", "Terminate the current task and report its completion status."),
    ),
}
_MOBILE_ACTIONS["mobile_use_mobileworld"] = (
    *_MOBILE_ACTIONS["mobile_use_notebook"],
    ("ask_user", "Ask user for clarification."),
)
_MOBILEWORLD_ENUM = [
    "click",
    "long_press",
    "swipe",
    "type",
    "answer",
    "system_button",
    "wait",
    "ask_user",
    "terminate",
]
_MOBILE_TEXT = {
    "mobile_use_utils": "Required only by `action=key`, `action=type`, and `action=open`.",
    "mobile_use_notebook": "Required only by `action=type` and `action=answer`.",
    "mobile_use_mobileworld": (
        "Required only by `action=type`, `action=ask_user` and `action=answer`."
    ),
}

_COMPUTER_ACTIONS: tuple[tuple[str, str], ...] = (
    (
        "key",
        "Performs key down presses on the arguments passed in order, then performs key "
        "releases in reverse order.",
    ),
    ("type", "Type a string of text on the keyboard."),
    ("mouse_move", "Move the cursor to a specified (x, y) pixel coordinate on the screen."),
    (
        "left_click",
        "Click the left mouse button at a specified (x, y) pixel coordinate on the screen.",
    ),
    (
        "left_click_drag",
        "Click and drag the cursor to a specified (x, y) pixel coordinate on the screen.",
    ),
    (
        "right_click",
        "Click the right mouse button at a specified (x, y) pixel coordinate on the screen.",
    ),
    (
        "middle_click",
        "Click the middle mouse button at a specified (x, y) pixel coordinate on the screen.",
    ),
    (
        "double_click",
        "Double-click the left mouse button at a specified (x, y) pixel coordinate on the screen.",
    ),
    (
        "triple_click",
        "Triple-click the left mouse button at a specified (x, y) pixel coordinate "
        "on the screen (simulated as double-click since it's the closest action).",
    ),
    ("scroll", "Performs a scroll of the mouse scroll wheel."),
    ("hscroll", "Performs a horizontal scroll (mapped to regular scroll)."),
    ("wait", "Wait specified seconds for the change to happen."),
    ("terminate", "Terminate the current task and report its completion status."),
    ("answer", "Answer a question."),
)

_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
_RESPONSE_FORMAT = (
    "\n\n# Response format\n\nResponse format for every step:\n"
    "1) Thought: one concise sentence explaining the next move (no multi-step reasoning).\n"
    "2) Action: a short imperative describing what to do{in_the_ui}.\n"
    "3) A single <tool_call>...</tool_call> block containing only the JSON: "
    '{{"name": <function-name>, "arguments": <args-json-object>}}.\n\n'
    "Rules:\n- Output exactly in the order: Thought, Action, <tool_call>.\n"
    "- Be brief: one sentence for Thought, one for Action.\n"
    "- Do not output anything else outside those three parts.\n"
    "- If finishing, use {terminate} in the tool call."
)
_PROGRESS = "Task progress (You have done the following operation on the current device): "
_TOOL_CALL_BODY = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _action_description(actions: Sequence[tuple[str, str]]) -> str:
    lines = "\n".join(f"* `{name}`: {text}" for name, text in actions)
    return f"The action to perform. The available actions are:\n{lines}"


def mobile_use_tool(variant: str, resolution: tuple[int, int]) -> dict[str, Any]:
    """The ``mobile_use`` function of ``variant`` with ``resolution`` (w, h) in its description."""
    actions = _MOBILE_ACTIONS[variant]
    enum = _MOBILEWORLD_ENUM if variant == "mobile_use_mobileworld" else [a for a, _ in actions]
    description = (
        "Use a touchscreen to interact with a mobile device, and take screenshots.\n"
        "* This is an interface to a mobile device with touchscreen. You can perform actions "
        "like clicking, typing, swiping, etc.\n"
        "* Some applications may take time to start or process actions, so you may need to wait "
        "and take successive screenshots to see the results of your actions.\n"
        f"* The screen's resolution is {resolution[0]}x{resolution[1]}.\n"
        "* Make sure to click any buttons, links, icons, etc with the cursor tip in the center "
        "of the element. Don't click boxes on their edges unless asked."
    )
    parameters = {
        "properties": {
            "action": {
                "description": _action_description(actions),
                "enum": enum,
                "type": "string",
            },
            "coordinate": {
                "description": f"{_POINT} Required only by `action=click`, `action=long_press`, "
                "and `action=swipe`.",
                "type": "array",
            },
            "coordinate2": {
                "description": f"{_POINT} Required only by `action=swipe`.",
                "type": "array",
            },
            "text": {"description": _MOBILE_TEXT[variant], "type": "string"},
            "time": {
                "description": "The seconds to wait. Required only by `action=long_press` and "
                "`action=wait`.",
                "type": "number",
            },
            "button": {
                "description": _BUTTON,
                "enum": ["Back", "Home", "Menu", "Enter"],
                "type": "string",
            },
            "status": dict(_STATUS),
        },
        "required": ["action"],
        "type": "object",
    }
    return _function("mobile_use", description, parameters)


def computer_use_tool(resolution: tuple[int, int]) -> dict[str, Any]:
    """Qwen3-VL's ``computer_use`` function with ``resolution`` (w, h) in its description."""
    description = (
        "Use a mouse and keyboard to interact with a computer, and take screenshots.\n"
        "* This is an interface to a desktop GUI. You do not have access to a terminal or "
        "applications menu. You must click on desktop icons to start applications.\n"
        "* Some applications may take time to start or process actions, so you may need to wait "
        "and take successive screenshots to see the results of your actions. E.g. if you click "
        "on Firefox and a window doesn't open, try wait and taking another screenshot.\n"
        f"* The screen's resolution is {resolution[0]}x{resolution[1]}.\n"
        "* Whenever you intend to move the cursor to click on an element like an icon, you "
        "should consult a screenshot to determine the coordinates of the element before moving "
        "the cursor.\n"
        "* If you tried clicking on a program or link but it failed to load, even after "
        "waiting, try adjusting your cursor position so that the tip of the cursor visually "
        "falls on the element that you want to click.\n"
        "* Make sure to click any buttons, links, icons, etc with the cursor tip in the center "
        "of the element. Don't click boxes on their edges."
    )
    parameters = {
        "properties": {
            "action": {
                "description": _action_description(_COMPUTER_ACTIONS),
                "enum": [name for name, _ in _COMPUTER_ACTIONS],
                "type": "string",
            },
            "keys": {"description": "Required only by `action=key`.", "type": "array"},
            "text": {
                "description": "Required only by `action=type` and `action=answer`.",
                "type": "string",
            },
            "coordinate": {"description": _POINT, "type": "array"},
            "pixels": {
                "description": "The amount of scrolling to perform. Positive values scroll up, "
                "negative values scroll down. Required only by `action=scroll` and "
                "`action=hscroll`.",
                "type": "number",
            },
            "time": {
                "description": "The seconds to wait. Required only by `action=wait`.",
                "type": "number",
            },
            "status": dict(_STATUS),
        },
        "required": ["action"],
        "type": "object",
    }
    return _function("computer_use", description, parameters)


def _function(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def resolution(config: PromptConfig, current: PreparedImage | None) -> tuple[int, int]:
    """What the resolution line says: the grid, or (``absolute_pixels``) the resized image."""
    if config.absolute_pixels:
        if current is None:
            raise ValueError("absolute_pixels needs the current image for the resolution line")
        return current.model_size
    return (config.screen_grid or 999, config.screen_grid or 999)


def system_prompt(config: PromptConfig, current: PreparedImage | None = None) -> str:
    """The hand-written system text of ``config.variant`` (see the module docstring)."""
    size = resolution(config, current)
    mobileworld = config.variant == "mobile_use_mobileworld"
    if config.variant == "computer_use":
        gui = computer_use_tool(size)
    else:
        gui = mobile_use_tool(config.variant or "mobile_use_notebook", size)
    lines = [json.dumps(gui, ensure_ascii=False)]
    if mobileworld and config.mcp_tools:
        # MobileWorld: a blank line, then each MCP tool dumped as given.
        lines.append("\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in config.mcp_tools))
    else:
        lines += [
            json.dumps({"type": "function", "function": t}, ensure_ascii=False)
            for t in config.mcp_tools
        ]
    preamble = "" if config.system_preamble is None else config.system_preamble + "\n\n"
    text = preamble + _TOOLS_HEAD + "".join("\n" + line for line in lines) + _TOOLS_TAIL
    if config.response_format:
        text += _RESPONSE_FORMAT.format(
            in_the_ui="" if mobileworld else " in the UI",
            terminate=f"{'mobile_use with ' if mobileworld else ''}action=terminate",
        )
    return text


def _clean(text: str) -> str:
    return text.replace("\n", "").replace('"', "")


def step_text(step: HistoryStep, dialect: Dialect) -> str:
    """One past turn as the "Step i:" entry describes it."""
    parsed = step.parsed
    if parsed.summary:
        text = _clean(parsed.summary.strip().strip('"'))
    else:
        formatted = format_past_action(dialect, step, thought=None)
        if formatted is not None:
            match = _TOOL_CALL_BODY.search(formatted)
            text = (match.group(1) if match else formatted).replace("\n", "")
        elif parsed.error is not None:
            text = f"Invalid output ({parsed.error.kind} error)"
        else:
            text = "No action"
    if step.feedback:
        feedback = step.feedback.strip()
        if isinstance(parsed.action, ToolCall):
            text += f"; Tool call result: <tool_response>{feedback}</tool_response>"
        elif isinstance(parsed.action, AskUser):
            text += f"; Ask user response: {feedback}"
        else:
            text += f"; Feedback: {feedback}"
        text = text.replace("\n", "")
    return text


def user_query(task: Task, steps: str, config: PromptConfig) -> str:
    if config.variant == "mobile_use_mobileworld":
        return f"\nThe user query: {task.prompt_text}\n{_PROGRESS}{steps}\n"
    return f"The user query: {task.prompt_text}.\n{_PROGRESS}{steps}.\n"


def render_messages(
    task: Task,
    history: Sequence[HistoryStep],
    current: PreparedImage,
    config: PromptConfig,
    dialect: Dialect,
    window: HistoryWindow,
    image_url: ImageUrl = message_url,
) -> tuple[list[dict[str, Any]], list[PreparedImage]]:
    """OpenAI-style messages and the images in prompt order. Pure and deterministic."""
    steps = "".join(f"Step {i + 1}: {step_text(history[i], dialect)}; " for i in window.turns)
    images = [history[i].screenshot for i in window.turns if window.has_image(i)]
    images.append(current)
    content: list[dict[str, Any]] = [{"type": "text", "text": user_query(task, steps, config)}]
    content += [{"type": "image_url", "image_url": {"url": image_url(im)}} for im in images]
    messages = [
        {"role": "system", "content": [{"type": "text", "text": system_prompt(config, current)}]},
        {"role": "user", "content": content},
    ]
    return messages, images
