"""The fast path at the real size: Qwen3-VL's pixel budget (1088x2400 phone images, 10,200
patches each) gives the same ids and bit-identical tensors as the processor run on the whole
prompt, for both families, a phone and a desktop screenshot, over a history window."""

from __future__ import annotations

import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters

from cua_native.actions.dialects import get_dialect
from cua_native.gym.protocol import Screenshot, Task
from cua_native.prompts import HistoryStep, PromptBuilder, default_prompt_config

from .conftest import noisy_screen

REAL_PIXELS = {"min_pixels": 65536, "max_pixels": 16777216}
GCONFIG = GenerationHyperparameters(max_new_tokens=16)
TASK = Task(task_id="real", instruction="Turn on Wi-Fi, then open Settings")
ANSWERS = {
    "mai_ui": (
        "<thinking>\ntap\n</thinking>\n<tool_call>\n"
        '{"name":"mobile_use","arguments":{"action":"click","coordinate":[299,399]}}\n'
        "</tool_call>"
    ),
    "qwen3_vl": (
        'Thought: tap\nAction: "Tap search."\n<tool_call>\n'
        '{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [447, 81]}}'
        "\n</tool_call>"
    ),
}


@pytest.mark.parametrize("family", ["mai_ui", "qwen3_vl"])
@pytest.mark.parametrize("size", [(1080, 2400), (1920, 1080)])
async def test_real_size_prompts_equal_the_processor(
    processor, family: str, size: tuple[int, int]
) -> None:
    config = default_prompt_config(family, history_images=3, **REAL_PIXELS)
    fast = PromptBuilder(config, processor, encode_images=False)
    slow = PromptBuilder(config, processor, use_processor=True, encode_images=False)
    assert fast.pixel_kernel is not None and fast.segments is not None and not slow.fast
    text = ANSWERS[family]
    action = get_dialect(family).parse(text)
    fast_history: list[HistoryStep] = []
    slow_history: list[HistoryStep] = []
    for turn in range(3):
        screen = Screenshot(image=noisy_screen(turn, *size))
        a = await fast.build_turn(TASK, fast_history, screen, GCONFIG)
        b = await slow.build_turn(TASK, slow_history, screen, GCONFIG)
        assert a.current is not None and b.current is not None
        assert a.current.model_size == b.current.model_size
        assert a.input_ids == b.input_ids and a.text == b.text
        assert len(a.images) == turn + 1
        assert a.multi_modal_input.keys() == b.multi_modal_input.keys()
        for key, value in a.multi_modal_input.items():
            other = b.multi_modal_input[key]
            assert value.dtype == other.dtype and torch.equal(value, other), key
        fast_history.append(HistoryStep(a.current, action, text))
        slow_history.append(HistoryStep(b.current, action, text))
    grid = a.multi_modal_input["image_grid_thw"]
    assert grid[-1].tolist() == [1, *(side // 16 for side in reversed(a.current.model_size))]
