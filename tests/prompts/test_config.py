from __future__ import annotations

import pytest

from cua_native.prompts import PromptConfig, PromptConfigError, default_prompt_config


def test_family_defaults() -> None:
    mai = default_prompt_config("mai_ui")
    assert (mai.variant, mai.history_images, mai.max_images, mai.screen_grid) == (
        "default",
        3,
        64,
        999,
    )
    assert mai.max_context_tokens == 262144 and mai.response_format is False
    qwen = default_prompt_config("qwen3_vl")
    assert (qwen.variant, qwen.history_images, qwen.response_format) == (
        "mobile_use_notebook",
        1,
        True,
    )
    assert qwen.system_preamble == ""
    computer = default_prompt_config("qwen3_vl", variant="computer_use")
    assert computer.screen_grid == 1000 and computer.response_format is False
    world = default_prompt_config("qwen3_vl", variant="mobile_use_mobileworld")
    assert world.system_preamble is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"family": "gpt"}, "family must be one of"),
        ({"family": "mai_ui", "variant": "computer_use"}, "is not a mai_ui variant"),
        ({"family": "mai_ui", "history_images": 0}, "history_images must be a positive integer"),
        ({"family": "qwen3_vl", "max_images": -1}, "max_images must be a positive integer"),
        ({"family": "qwen3_vl", "min_pixels": 10, "max_pixels": 5}, "must not exceed max_pixels"),
        ({"family": "mai_ui", "response_format": True}, "response_format is a Qwen3-VL option"),
        (
            {"family": "mai_ui", "mcp_tools": ({"name": "x"},)},
            "need the MAI-UI variant 'ask_user_mcp'",
        ),
        (
            {"family": "mai_ui", "variant": "ask_user_mcp", "mcp_tools": ({"no": 1},)},
            "mcp_tools[0]",
        ),
        ({"family": "qwen3_vl", "mcp_tools": ({"name": "mobile_use"},)}, "reserved name"),
        ({"family": "qwen3_vl", "available_apps": ("Chrome",)}, "MAI-UI option"),
        ({"family": "mai_ui", "absolute_pixels": True}, "Qwen option"),
        ({"family": "mai_ui", "max_context_tokens": True}, "max_context_tokens"),
    ],
)
def test_invalid_configs_are_refused_clearly(kwargs: dict, message: str) -> None:
    with pytest.raises(PromptConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        PromptConfig(**kwargs)


def test_unknown_override_is_named() -> None:
    with pytest.raises(PromptConfigError, match="history_imgs"):
        default_prompt_config("mai_ui", history_imgs=2)
