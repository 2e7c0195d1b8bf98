"""The fast path (cached per-image tensors, pads expanded by hand) equals the processor.

Exactness is defined against the processor given the same rendered conversation and the same
resized images: ids, ``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids`` must be
identical (values and dtypes), on multi-turn, multi-image, Unicode prompts of both prompt
families and two processor classes.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters

from cua_native.actions.dialects import get_dialect
from cua_native.gym.protocol import Task
from cua_native.prompts import HistoryStep, PromptBuilder, default_prompt_config
from cua_native.prompts.request import run_processor, tokenizer_messages

GCONFIG = GenerationHyperparameters(max_new_tokens=16)
TASK = Task(
    task_id="t",
    instruction="打开设置并开启 Wi-Fi 🙂, then reply «ok» — ü é ß. " + "Long instruction. " * 200,
)
MAI_CLICK = (
    "<thinking>\n点击 Wi-Fi 🙂\n</thinking>\n<tool_call>\n"
    '{"name":"mobile_use","arguments":{"action":"click","coordinate":[299,399]}}\n</tool_call>'
)
QWEN_CLICK = (
    'Thought: 点击搜索栏 🙂\nAction: "Tap «search»."\n<tool_call>\n'
    '{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [447, 81]}}'
    "\n</tool_call>"
)
CASES = [
    ("processor", "mai_ui", {}),
    ("processor", "mai_ui", {"variant": "no_thinking", "history_images": 4}),
    ("processor", "qwen3_vl", {"history_images": 3}),
    ("processor", "qwen3_vl", {"variant": "mobile_use_mobileworld"}),
    ("qwen25_processor", "mai_ui", {}),
    ("qwen25_processor", "qwen3_vl", {"history_images": 2, "absolute_pixels": True}),
]


def _step(family: str, image, turn: int) -> HistoryStep:
    text = MAI_CLICK if family == "mai_ui" else QWEN_CLICK
    feedback = f"用户回复 {turn} 🙂\nok" if turn == 1 else None
    return HistoryStep(image, get_dialect(family).parse(text), text, feedback)


def _assert_same(fast: list[int], fast_mm: dict[str, torch.Tensor], ref: Any) -> None:
    ref_ids = ref["input_ids"]
    ref_ids = ref_ids[0].tolist() if isinstance(ref_ids, torch.Tensor) else ref_ids
    assert fast == ref_ids
    for key in ("pixel_values", "image_grid_thw", "mm_token_type_ids"):
        assert fast_mm[key].dtype == ref[key].dtype, key
        assert torch.equal(fast_mm[key], ref[key]), key


def _processor_chat(processor, messages: list[dict], images) -> Any:
    """The processor's own multimodal chat path on the same conversation and images."""
    conversation = tokenizer_messages(messages)
    pil = iter(im.image for im in images)
    for message in conversation:
        for part in message["content"]:
            if part.get("type") == "image":
                part["image"] = next(pil)
    return processor.apply_chat_template(
        conversation,
        tokenize=True,
        return_dict=True,
        add_generation_prompt=True,
        return_tensors="pt",
        do_resize=False,
    )


@pytest.mark.parametrize(("fixture", "family", "overrides"), CASES)
async def test_fast_path_equals_the_processor_every_turn(
    request: pytest.FixtureRequest, make_shots, fixture: str, family: str, overrides: dict
) -> None:
    processor = request.getfixturevalue(fixture)
    config = default_prompt_config(family, **overrides)
    builder = PromptBuilder(config, processor, encode_images=False)
    assert builder.fast and builder.pixel_kernel and builder.segments is not None
    shots = make_shots(builder.sizing, 5)
    merge = processor.image_processor.merge_size
    pad = processor.image_token_id
    history: list[HistoryStep] = []
    for turn, shot in enumerate(shots):
        built = await builder.build(TASK, history, shot, GCONFIG)
        assert built.images[-1] is shot
        assert len(built.images) == min(turn + 1, config.history_images)
        reference = run_processor(processor, built.messages, built.images)
        assert reference.text == built.text
        _assert_same(
            built.input_ids,
            built.multi_modal_input,
            reference.multi_modal_input | {"input_ids": reference.input_ids},
        )
        grid = built.multi_modal_input["image_grid_thw"]
        implied = int(grid.prod(-1).sum()) // (merge * merge)
        assert sum(t == pad for t in built.input_ids) == implied
        assert int(built.multi_modal_input["mm_token_type_ids"].sum()) == implied
        assert built.text.count(processor.image_token) == len(built.images)  # one pad each
        history.append(_step(family, shot, turn))
    # The last, fullest prompt also against the processor's own chat-template route.
    _assert_same(
        built.input_ids,
        built.multi_modal_input,
        _processor_chat(processor, built.messages, built.images),
    )
    decoded = processor.tokenizer.decode(built.input_ids)
    assert "Wi-Fi 🙂" in decoded and "«ok» — ü é ß" in decoded


async def test_reference_builder_gives_the_same_prompt(processor, make_shots) -> None:
    config = default_prompt_config("mai_ui")
    fast = PromptBuilder(config, processor)
    slow = PromptBuilder(config, processor, use_processor=True)
    assert fast.fast and not slow.fast
    shots = make_shots(fast.sizing, 3)
    history = [_step("mai_ui", im, i) for i, im in enumerate(shots[:2])]
    a = await fast.build(TASK, history, shots[2], GCONFIG)
    b = await slow.build(TASK, history, shots[2], GCONFIG)
    assert a.input_ids == b.input_ids and a.text == b.text and a.messages == b.messages
    assert a.multi_modal_input.keys() == b.multi_modal_input.keys()
    for key, value in a.multi_modal_input.items():
        assert torch.equal(value, b.multi_modal_input[key]), key
    assert a.request.image_data == b.request.image_data
    assert a.request.vision_msg_vllm == b.request.vision_msg_vllm


async def test_unknown_processor_class_takes_the_reference_path(processor, make_shots) -> None:
    class OtherProcessor:
        """Delegates to the real processor under a class name the fast path does not know."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def __call__(self, **kwargs: Any) -> Any:
            return self.inner(**kwargs)

    config = default_prompt_config("qwen3_vl")
    other = PromptBuilder(config, OtherProcessor(processor))
    fast = PromptBuilder(config, processor)
    assert not other.fast and fast.fast
    shot = make_shots(fast.sizing, 1)[0]
    a = await other.build(TASK, [], shot, GCONFIG)
    b = await fast.build(TASK, [], shot, GCONFIG)
    assert a.input_ids == b.input_ids
    assert torch.equal(a.multi_modal_input["pixel_values"], b.multi_modal_input["pixel_values"])
