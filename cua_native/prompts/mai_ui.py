"""MAI-UI prompts: the published system prompts and the navigation agent's history layout.

Variants: ``default``, ``no_thinking``, ``ask_user_mcp`` (navigation) and ``grounding`` (one
screenshot, one ``<answer>`` point; ``MAIGroundingAgent``).

Layout (``MAIUINaivigationAgent._build_messages``, MAI-UI@4dd07b9): system; user(task text);
for every past turn, oldest first: [user(screenshot) if within the image window], assistant(the
turn re-serialised with the dialect's ``format``), [user(feedback)]; then user(current
screenshot). Two upstream bugs are not ported: drag points are written back on the grid, and
MCP calls keep their tool name (both handled by the dialect's ``format``).

A turn whose output did not parse keeps the model's raw text as the assistant message, followed
by a user message with the feedback the workflow gave (when it gave one): the model sees what it
actually wrote and why it was refused, instead of an action it never produced.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

from jinja2 import Template

from cua_native.actions.dialects import Dialect
from cua_native.gym.protocol import Task
from cua_native.prompts.config import PromptConfig
from cua_native.prompts.history import HistoryStep, HistoryWindow, format_past_action
from cua_native.prompts.images import ImageUrl, PreparedImage, message_url

ANDROID_WORLD_APPS = '`["Camera","Chrome","Clock","Contacts","Dialer","Files","Settings","Markor","Tasks","Simple Draw Pro","Simple Gallery Pro","Simple SMS Messenger","Audio Recorder","Pro Expense","Broccoli APP","OSMand","VLC","Joplin","Retro Music","OpenTracks","Simple Calendar Pro"]`'
MOBILE_WORLD_APPS = '`["Contacts", "Settings", "Clock", "Maps", "Chrome", "Calendar", "files", "Gallery", "Taodian", "Mattermost", "Mastodon", "Mail", "SMS", "Camera"]`'


def _read(name: str) -> str:
    return resources.files("cua_native.prompts").joinpath("texts", name).read_text("utf-8")


DEFAULT_PROMPT = _read("mai_ui_default.txt")
NO_THINKING_PROMPT = _read("mai_ui_no_thinking.txt")
GROUNDING_PROMPT = _read("mai_ui_grounding.txt")
"""``MAI_MOBILE_SYS_PROMPT_GROUNDING``: single-step grounding (``<grounding_think>``/``<answer>``)."""
ASK_USER_MCP_TEMPLATE = Template(_read("mai_ui_ask_user_mcp.jinja"))
"""Rendered with jinja2's defaults, as upstream (``{% endif -%}`` eats the blank lines)."""


def system_prompt(config: PromptConfig) -> str:
    """The system prompt of ``config.variant`` exactly as MAI-UI renders it."""
    if config.variant == "ask_user_mcp":
        tools = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in config.mcp_tools)
        text = ASK_USER_MCP_TEMPLATE.render(tools=tools)
        return _with_apps(text, MOBILE_WORLD_APPS, config.available_apps, spaced=True)
    if config.variant == "grounding":
        return GROUNDING_PROMPT
    text = NO_THINKING_PROMPT if config.variant == "no_thinking" else DEFAULT_PROMPT
    return _with_apps(text, ANDROID_WORLD_APPS, config.available_apps, spaced=False)


def _with_apps(text: str, listed: str, apps: Sequence[str] | None, *, spaced: bool) -> str:
    """Replace the prompt's own app list, written in that prompt's JSON spacing."""
    if apps is None:
        return text
    if text.count(listed) != 1:
        raise RuntimeError("the MAI-UI prompt text does not hold its app list exactly once")
    separators = (", ", ": ") if spaced else (",", ":")
    return text.replace(
        listed, f"`{json.dumps(list(apps), ensure_ascii=False, separators=separators)}`"
    )


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _image_message(image: PreparedImage, image_url: ImageUrl) -> dict[str, Any]:
    part = {"type": "image_url", "image_url": {"url": image_url(image)}}
    return {"role": "user", "content": [part]}


def _assistant_text(step: HistoryStep, dialect: Dialect, thinking: bool) -> str:
    thought = step.parsed.thought if thinking else None
    formatted = format_past_action(dialect, step, thought)
    return step.raw_text if formatted is None else formatted


def render_messages(
    task: Task,
    history: Sequence[HistoryStep],
    current: PreparedImage,
    config: PromptConfig,
    dialect: Dialect,
    window: HistoryWindow,
    image_url: ImageUrl = message_url,
) -> tuple[list[dict[str, Any]], list[PreparedImage]]:
    """OpenAI-style messages and the images in prompt order. Pure and deterministic.

    The ``grounding`` variant is single-step, as ``MAIGroundingAgent._build_messages``: system;
    user(instruction + "\\n", screenshot); ``history`` is not shown.
    """
    if config.variant == "grounding":
        instruction = _text_part(task.prompt_text + "\n")
        screenshot = _image_message(current, image_url)["content"][0]
        return [
            {"role": "system", "content": [_text_part(system_prompt(config))]},
            {"role": "user", "content": [instruction, screenshot]},
        ], [current]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": [_text_part(system_prompt(config))]},
        {"role": "user", "content": [_text_part(task.prompt_text)]},
    ]
    images: list[PreparedImage] = []
    thinking = config.variant != "no_thinking"
    for index in window.turns:
        step = history[index]
        if window.has_image(index):
            messages.append(_image_message(step.screenshot, image_url))
            images.append(step.screenshot)
        assistant = _assistant_text(step, dialect, thinking)
        messages.append({"role": "assistant", "content": [_text_part(assistant)]})
        if step.feedback:
            messages.append({"role": "user", "content": [_text_part(step.feedback)]})
    messages.append(_image_message(current, image_url))
    images.append(current)
    return messages, images
