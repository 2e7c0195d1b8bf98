"""Packed rows under ``PACKED_SDPA`` and each screenshot encoded once give what one row at a time
gives: log-probs and gradients of the tiny Qwen3-VL in fp32 within 1e-5, the vision tower fed
each distinct image once, distinct screenshots never merged (``training.packing``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText

from cua_native.training.packing import (
    allocate_groups,
    image_owners,
    row_groups,
    share_screenshots,
    use_packed_attention,
)

TOLERANCE = 1e-5


def _image(seed: int) -> Image.Image:
    generator = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(320, 160, 3, generator=generator) * 255).to(torch.uint8)
    return Image.fromarray(pixels.numpy())


def _row(processor: Any, text: str, images: list[Image.Image]) -> dict[str, torch.Tensor]:
    content = [{"type": "text", "text": text}] + [{"type": "image"} for _ in images]
    messages = [{"role": "user", "content": content}]
    prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return dict(processor(text=[prompt], images=images, return_tensors="pt"))


@pytest.fixture(scope="module")
def model(tiny_dir: Path) -> Any:
    torch.manual_seed(0)
    loaded = AutoModelForImageTextToText.from_pretrained(
        tiny_dir, dtype=torch.float32, attn_implementation="sdpa"
    )
    return loaded.eval()


@pytest.fixture
def episode_rows(processor: Any) -> list[dict[str, torch.Tensor]]:
    """An episode's per-turn rows (history of one screenshot) and a second episode that
    starts from the same screen: five screenshot copies of four distinct images."""
    a, b, c, d = (_image(s) for s in range(4))
    return [
        _row(processor, "open the settings", [a]),
        _row(processor, "open the settings, then wifi", [a, b]),
        _row(processor, "open the settings", [a]),
        _row(processor, "open the settings, then wifi", [c, d]),
    ]


def _packed(model: Any, rows: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """The rows as AReaL packs them: one sequence, per-row 3-D positions, sequence starts."""
    positions = [
        model.model.get_rope_index(r["input_ids"], r["mm_token_type_ids"], r["image_grid_thw"])[0]
        for r in rows
    ]
    lengths = [int(r["input_ids"].shape[1]) for r in rows]
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return {
        "input_ids": torch.cat([r["input_ids"] for r in rows], 1),
        "position_ids": torch.cat(positions, 2),
        "pixel_values": torch.cat([r["pixel_values"] for r in rows]),
        "image_grid_thw": torch.cat([r["image_grid_thw"] for r in rows]),
        "cu_seq_lens_q": starts,
        "cu_seq_lens_k": starts,
        "max_length_q": max(lengths),
        "max_length_k": max(lengths),
        "lengths": lengths,
    }


def _target_logp(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each next token (the quantity PPO trains on)."""
    logp = torch.log_softmax(logits[:-1].float(), -1)
    return logp.gather(-1, ids[1:, None])[:, 0]


def _one_by_one(model: Any, rows: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
    return [_target_logp(model(**r).logits[0], r["input_ids"][0]) for r in rows]


def _packed_logp(model: Any, rows: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
    inputs = _packed(model, rows)
    lengths = inputs.pop("lengths")
    logits = model(**inputs).logits[0]
    ids = inputs["input_ids"][0]
    return [
        _target_logp(chunk, row_ids)
        for chunk, row_ids in zip(
            torch.split(logits, lengths), torch.split(ids, lengths), strict=True
        )
    ]


def _installed(model: Any, *, dedupe: bool = True) -> Any:
    packed = copy.deepcopy(model)
    share_screenshots(packed, dedupe=dedupe)
    use_packed_attention(packed)
    return packed


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def test_packed_vision_once_log_probs_equal_one_by_one(model: Any, episode_rows: list[Any]) -> None:
    packed = _installed(model)
    with torch.no_grad():
        reference = _one_by_one(model, episode_rows)
        got = _packed_logp(packed, episode_rows)
    assert _max_diff(reference, got) <= TOLERANCE


def test_packed_vision_once_gradients_equal_one_by_one(model: Any, episode_rows: list[Any]) -> None:
    reference_model = copy.deepcopy(model)
    packed = _installed(model)
    loss = -sum(lp[-8:].sum() for lp in _one_by_one(reference_model, episode_rows))
    assert isinstance(loss, torch.Tensor)
    loss.backward()
    packed_loss = -sum(lp[-8:].sum() for lp in _packed_logp(packed, episode_rows))
    assert isinstance(packed_loss, torch.Tensor)
    packed_loss.backward()
    assert abs(float(loss.detach()) - float(packed_loss.detach())) <= TOLERANCE
    expected = dict(reference_model.named_parameters())
    worst = 0.0
    checked = 0
    for name, param in packed.named_parameters():
        ref_grad = expected[name].grad
        if ref_grad is None:
            assert param.grad is None or float(param.grad.abs().max()) == 0.0, name
            continue
        assert param.grad is not None, name
        worst = max(worst, float((param.grad - ref_grad).abs().max()))
        checked += 1
    assert checked > 0 and any("visual" in n for n, p in expected.items() if p.grad is not None)
    assert worst <= TOLERANCE


def test_vision_tower_sees_each_distinct_screenshot_once(
    model: Any, episode_rows: list[Any]
) -> None:
    packed = _installed(model)
    seen: list[int] = []

    def count(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        grid = kwargs.get("grid_thw")
        seen.append(int((grid if grid is not None else args[1]).shape[0]))

    hook = packed.model.visual.register_forward_pre_hook(count, with_kwargs=True)
    try:
        with torch.no_grad():
            _packed_logp(packed, episode_rows)
    finally:
        hook.remove()
    assert sum(int(r["image_grid_thw"].shape[0]) for r in episode_rows) == 6
    assert seen == [4]


def test_distinct_screenshots_with_equal_fingerprints_stay_apart(
    model: Any, processor: Any
) -> None:
    """Two screenshots whose patch rows are a permutation of each other have the same
    column sums (the fingerprint) but different content: each row must get its own."""
    first = _row(processor, "tap", [_image(7)])
    second = {k: v.clone() for k, v in first.items()}
    second["pixel_values"] = second["pixel_values"].flip(0)
    rows = [first, second]
    owner, firsts = image_owners(
        torch.cat([first["pixel_values"], second["pixel_values"]]),
        torch.cat([first["image_grid_thw"], second["image_grid_thw"]]),
    )
    assert owner == [0, 1] and firsts == [0, 1]
    with torch.no_grad():
        reference = _one_by_one(model, rows)
        got = _packed_logp(_installed(model), rows)
    assert float((reference[0] - reference[1]).abs().max()) > 1e-3  # the rows do differ
    assert _max_diff(reference, got) <= TOLERANCE


def test_image_owners_map_each_copy_to_its_first() -> None:
    a, b, c = (torch.randn(12, 6, generator=torch.Generator().manual_seed(s)) for s in range(3))
    grid = torch.tensor([[1, 3, 4]] * 5)
    owner, firsts = image_owners(torch.cat([a, b, a, c, b]), grid)
    assert owner == [0, 1, 0, 3, 1]
    assert firsts == [0, 1, 3]
    # same pixels under another grid are another image
    owner, _ = image_owners(torch.cat([a, a]), torch.tensor([[1, 3, 4], [1, 4, 3]]))
    assert owner == [0, 1]


def test_without_packed_attention_packed_rows_leak(model: Any, episode_rows: list[Any]) -> None:
    """The control: plain ``sdpa`` over the same packed rows attends across the boundary."""
    leaky = copy.deepcopy(model)
    share_screenshots(leaky)
    with torch.no_grad():
        reference = _one_by_one(model, episode_rows)
        got = _packed_logp(leaky, episode_rows)
    assert _max_diff(reference, got) > 1e-3


def test_row_groups_join_rows_that_share_a_screenshot() -> None:
    def entry(*seeds: int) -> dict[str, torch.Tensor]:
        images = [torch.randn(8, 6, generator=torch.Generator().manual_seed(s)) for s in seeds]
        return {
            "pixel_values": torch.cat(images),
            "image_grid_thw": torch.tensor([[1, 2, 4]] * len(seeds)),
        }

    rows = [entry(0), entry(0, 1), entry(2), entry(1, 3), entry(4), {}]
    assert row_groups(rows) == [0, 0, 2, 0, 4, 5]


def test_allocate_groups_keeps_groups_and_respects_the_cap() -> None:
    lengths = [3, 6, 3, 6, 2, 2]
    groups = [0, 0, 0, 0, 4, 4]
    # the whole first group (18) fits: it stays one micro-batch
    assert allocate_groups(lengths, groups, 18) == [[0, 1, 2, 3], [4, 5]]
    # over the cap: cut into consecutive runs (an episode's turns), the small group fills up
    assert allocate_groups(lengths, groups, 9) == [[0, 1], [2, 3], [4, 5]]
    # three micro-batches asked for, one needed: the widest is halved until there are three
    assert allocate_groups(lengths, groups, 100, min_bins=3) == [[0], [1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="micro-batches"):
        allocate_groups([1], [0], 10, min_bins=2)
