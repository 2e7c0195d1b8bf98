"""System texts are byte-exact with the upstream sources (fixtures rendered from them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from cua_native.prompts import default_prompt_config, mai_ui, qwen3_vl
from cua_native.prompts.images import ImageSizing, prepare_image

FIXTURES = Path(__file__).parent / "fixtures"
MAI = json.loads((FIXTURES / "mai_ui_upstream_prompts.json").read_text("utf-8"))
QWEN = json.loads((FIXTURES / "qwen3_vl_upstream_prompts.json").read_text("utf-8"))


@pytest.mark.parametrize(
    ("variant", "tools", "key"),
    [
        ("default", (), "default"),
        ("no_thinking", (), "no_thinking"),
        ("ask_user_mcp", (), "ask_user_mcp_no_tools"),
        ("ask_user_mcp", tuple(MAI["tools"]), "ask_user_mcp_tools"),
        ("grounding", (), "grounding"),
    ],
)
def test_mai_ui_system_prompts_match_upstream(variant: str, tools: tuple, key: str) -> None:
    config = default_prompt_config("mai_ui", variant=variant, mcp_tools=tools)
    assert mai_ui.system_prompt(config) == MAI[key]


def test_mai_ui_app_list_override_keeps_each_prompts_spacing() -> None:
    apps = ("Settings", "设置")
    default = mai_ui.system_prompt(default_prompt_config("mai_ui", available_apps=apps))
    assert 'Available Apps: `["Settings","设置"]`.' in default
    assert "Simple Calendar Pro" not in default
    mcp = default_prompt_config("mai_ui", variant="ask_user_mcp", available_apps=apps)
    assert 'Available Apps: `["Settings", "设置"]`.' in mai_ui.system_prompt(mcp)


def test_qwen_notebook_system_prompt_matches_upstream() -> None:
    text = qwen3_vl.system_prompt(default_prompt_config("qwen3_vl"))
    assert text == QWEN["notebook_system_prompt"]
    assert text.startswith("\n\n# Tools")


def test_qwen_mobileworld_system_prompt_matches_upstream() -> None:
    plain = default_prompt_config("qwen3_vl", variant="mobile_use_mobileworld")
    assert qwen3_vl.system_prompt(plain) == QWEN["mobileworld_no_tools"]
    tools = default_prompt_config(
        "qwen3_vl", variant="mobile_use_mobileworld", mcp_tools=tuple(QWEN["mcp_tools"])
    )
    assert qwen3_vl.system_prompt(tools) == QWEN["mobileworld_tools"]


@pytest.mark.parametrize("key", sorted(QWEN["tool_lines"]))
def test_qwen_tool_json_matches_qwen_agent_dump(key: str) -> None:
    size = tuple(int(v) for v in key.rsplit("_", 1)[1].split("x"))
    if key.startswith("computer_use"):
        tool = qwen3_vl.computer_use_tool(size)
    else:
        tool = qwen3_vl.mobile_use_tool("mobile_use_utils", size)
    assert json.dumps(tool, ensure_ascii=False) == QWEN["tool_lines"][key]


def test_qwen_variants_and_options() -> None:
    utils = qwen3_vl.system_prompt(default_prompt_config("qwen3_vl", variant="mobile_use_utils"))
    assert QWEN["tool_lines"]["mobile_use_utils_999x999"] in utils
    assert "# Response format" not in utils
    computer = default_prompt_config(
        "qwen3_vl", variant="computer_use", system_preamble="You are a helpful assistant."
    )
    text = qwen3_vl.system_prompt(computer)
    assert text.startswith("You are a helpful assistant.\n\n# Tools\n")
    assert QWEN["tool_lines"]["computer_use_1000x1000"] in text
    absolute = default_prompt_config("qwen3_vl", absolute_pixels=True)
    image = prepare_image(Image.new("RGB", (1080, 2400)), ImageSizing(32, 16 * 1024, 128 * 1024))
    assert "resolution is 224x512." in qwen3_vl.system_prompt(absolute, image)
    mcp = default_prompt_config("qwen3_vl", mcp_tools=({"name": "weather", "parameters": {}},))
    assert (
        '\n{"type": "function", "function": {"name": "weather", "parameters": {}}}\n</tools>'
        in (qwen3_vl.system_prompt(mcp))
    )
