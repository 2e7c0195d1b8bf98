"""The vision cache: each image encoded once, log-probs still those of one plain forward pass."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest

from cua_native.engine.vision_cache import EncodedImage, VisionCache, image_keys

FP32_TOLERANCE = 1e-5
COLORS = [(20, 120, 200), (200, 40, 90), (60, 200, 60), (240, 200, 10)]


def _request(kit: Any, shown: list[int], seed: int, new_tokens: int = 8) -> ModelRequest:
    """A prompt showing the screenshots ``shown`` (indices into ``COLORS``), like a MAI-UI
    turn whose history window holds earlier screenshots."""
    processor = kit.tiny.processor
    images = [kit.screenshot(COLORS[i]) for i in shown]
    content: list[dict[str, str]] = [{"type": "image"} for _ in images]
    content.append({"type": "text", "text": f"Step {seed}: open Settings"})
    rendered = processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    out = processor(text=[rendered], images=images, return_tensors="pt")
    return ModelRequest(
        input_ids=out["input_ids"][0].tolist(),
        tokenizer=kit.tiny.tokenizer,
        gconfig=GenerationHyperparameters(
            max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True
        ),
        metadata={
            "seed": seed,
            "multi_modal_input": {
                "pixel_values": out["pixel_values"].clone(),  # a new tensor every turn
                "image_grid_thw": out["image_grid_thw"],
            },
        },
    )


def _assert_exact(kit: Any, req: ModelRequest, resp: Any) -> None:
    ref = kit.reference(req, resp.output_tokens, 1.0)
    got = torch.tensor(resp.output_logprobs)
    assert (got - ref).abs().max() <= FP32_TOLERANCE, (got - ref).abs().max()


@pytest.mark.parametrize("decoder", ["slots", "legacy"])
async def test_episode_turns_encode_each_screenshot_once_and_stay_exact(
    kit: Any, decoder: str
) -> None:
    """Turns showing a sliding window of screenshots (one after another), then a batch of
    rows sharing images: every image is encoded once, every log-prob matches one forward."""
    engine = kit.engine(decoder=decoder, max_batch_size=4)
    try:
        cache = engine.vision_cache
        assert cache is not None
        turns = [_request(kit, [0], 1), _request(kit, [0, 1], 2), _request(kit, [0, 1, 2], 3)]
        for req in turns:
            _assert_exact(kit, req, await engine.agenerate(req))
        assert (cache.misses, cache.hits, len(cache)) == (3, 3, 3)
        group = [_request(kit, [1, 2, 3], 10 + i) for i in range(3)]  # GRPO-like: one prompt
        group.append(_request(kit, [3, 3], 20))  # an image twice in one prompt
        responses = await asyncio.gather(*(engine.agenerate(r) for r in group))
        for req, resp in zip(group, responses, strict=True):
            _assert_exact(kit, req, resp)
        assert cache.misses == 4 and len(cache) == 4  # only screenshot 3 was new
    finally:
        engine.destroy()


async def test_cache_off_and_on_sample_the_same_tokens(kit: Any) -> None:
    on, off = kit.engine(), kit.engine(vision_cache_mb=0)
    try:
        assert off.vision_cache is None
        for shown, seed in (([0, 1], 5), ([1, 2], 6)):
            req = _request(kit, shown, seed, new_tokens=12)
            a, b = await on.agenerate(req), await off.agenerate(req)
            assert a.output_tokens == b.output_tokens
            assert (
                max(abs(x - y) for x, y in zip(a.output_logprobs, b.output_logprobs, strict=True))
                < 1e-5
            )
    finally:
        on.destroy()
        off.destroy()


async def test_weight_update_empties_the_cache(kit: Any) -> None:
    """Encoded images belong to the weights that encoded them: an update drops them, and the
    next turn is exact against the updated model."""
    engine = kit.engine()
    try:
        req = _request(kit, [0, 1], 7)
        await engine.agenerate(req)
        cache = engine.vision_cache
        assert cache is not None and len(cache) == 2
        state = {k: v.clone() for k, v in engine.model.state_dict().items() if "visual" in k}
        state = {k: v * 1.01 if v.is_floating_point() else v for k, v in state.items()}
        engine.update_weights_from_state_dict(state, version=1).result(timeout=60)
        assert len(cache) == 0
        resp = await engine.agenerate(req)
        _assert_exact_with(kit, engine.model, req, resp)
    finally:
        engine.destroy()


def _assert_exact_with(kit: Any, model: Any, req: ModelRequest, resp: Any) -> None:
    ref = kit.reference(req, resp.output_tokens, 1.0, model=model)
    got = torch.tensor(resp.output_logprobs)
    assert (got - ref).abs().max() <= FP32_TOLERANCE, (got - ref).abs().max()


async def test_builder_turns_carry_keys_the_cache_uses(kit: Any) -> None:
    """Turns from the real prompt builder (MAI-UI, a window of three screenshots): the keys
    come with the pixels (no hashing in the engine), the same screenshot prepared again gets
    the same key, and each screenshot is encoded once, exact against one forward pass."""
    from cua_native.actions.dialects import get_dialect
    from cua_native.gym.protocol import Screenshot, Task
    from cua_native.prompts import HistoryStep, PromptBuilder, default_prompt_config

    click = (
        "<thinking>\nTap\n</thinking>\n<tool_call>\n"
        '{"name":"mobile_use","arguments":{"action":"click","coordinate":[299,399]}}\n'
        "</tool_call>"
    )
    builder = PromptBuilder(
        default_prompt_config("mai_ui"), kit.tiny.processor, encode_images=False
    )
    engine = kit.engine()
    try:
        cache = engine.vision_cache
        assert cache is not None
        history: list[HistoryStep] = []
        for i in range(4):
            current = await builder.prepare_image(Screenshot(image=kit.screenshot(COLORS[i])))
            built = await builder.build(
                Task(task_id="t", instruction="Open Settings"),
                history[-2:],
                current,
                GenerationHyperparameters(max_new_tokens=6, temperature=1.0, ignore_eos=True),
            )
            keys = built.request.metadata["multi_modal_input"].image_keys
            assert keys is not None and len(keys) == min(i + 1, 3)
            resp = await engine.agenerate(built.request)
            _assert_exact(kit, built.request, resp)
            history.append(HistoryStep(current, get_dialect("mai_ui").parse(click), click))
        assert cache.misses == 4 and cache.hits == 1 + 2 + 2
        again = await builder.prepare_image(Screenshot(image=kit.screenshot(COLORS[0])))
        built = await builder.build(
            Task(task_id="t", instruction="Open Settings"), [], again, _request(kit, [0], 1).gconfig
        )
        assert built.request.metadata["multi_modal_input"].image_keys[0] in cache._entries
    finally:
        engine.destroy()


def test_keys_are_the_same_hashed_in_parallel_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from cua_native.engine import vision_cache

    grid = torch.tensor([[1, 4, 4], [1, 2, 6]])
    pixels = torch.randn(28, 6)
    whole = image_keys(pixels, grid)
    monkeypatch.setattr(vision_cache, "CHUNK_BYTES", 3 * 6 * 4)  # 3 rows a chunk
    with ThreadPoolExecutor(3) as pool:
        chunked = image_keys(pixels, grid, pool)
    assert chunked == image_keys(pixels, grid)  # chunking is deterministic
    assert len(set(chunked)) == 2 and chunked != whole  # another tree, still per image
    changed = pixels.clone()
    changed[27, 5] += 1.0  # the last value of the last image
    assert image_keys(changed, grid)[1] != chunked[1]


def test_keys_follow_content_not_tensors() -> None:
    grid = torch.tensor([[1, 2, 2], [1, 2, 4]])
    pixels = torch.randn(12, 6)
    keys = image_keys(pixels, grid)
    assert len(set(keys)) == 2
    assert image_keys(pixels.clone(), grid.clone()) == keys
    changed = pixels.clone()
    changed[5, 0] += 1e-3  # one value of the second image
    assert image_keys(changed, grid) == (keys[0], image_keys(changed, grid)[1])
    assert image_keys(changed, grid)[1] != keys[1]
    assert image_keys(pixels.bfloat16(), grid) != image_keys(pixels.bfloat16().float(), grid)
    with pytest.raises(ValueError, match="pixel rows"):
        image_keys(pixels[:-1], grid)


def test_cache_is_bounded_least_recently_used_first_out() -> None:
    def encoded(value: float) -> EncodedImage:  # 4 x 8 float32 = 128 bytes, two tensors
        return EncodedImage(torch.full((4, 8), float(value)), (torch.full((4, 8), float(value)),))

    cache = VisionCache(max_bytes=3 * 256)
    for i in range(3):
        cache.put(f"k{i}", encoded(i))
    assert cache.get("k0") is not None  # k0 is now the most recently used
    cache.put("k3", encoded(3))
    assert cache.get("k1") is None and len(cache) == 3 and cache.bytes == 3 * 256
    assert [cache.get(k) is not None for k in ("k0", "k2", "k3")] == [True, True, True]
    small = VisionCache(max_bytes=100)
    small.put("big", encoded(0))  # larger than the bound: not kept
    assert len(small) == 0 and small.bytes == 0
