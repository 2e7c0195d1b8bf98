"""Per-turn work of the fast path: tensors once per image, lazy PNGs, released history."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters
from PIL import Image

from cua_native.actions.dialects import get_dialect
from cua_native.gym.protocol import Screenshot, Task
from cua_native.prompts import (
    HistoryStep,
    PromptBuilder,
    PromptTokenMismatch,
    default_prompt_config,
    pixels,
)
from cua_native.prompts.images import (
    RESIZE_REDUCING_GAP,
    UNENCODED_IMAGE_URL,
    ImageSizing,
    PreparedImage,
    banded_resize,
    prepare_image,
    resize_for_model,
)
from cua_native.prompts.request import expand_prompt, tokenize_prompt

GCONFIG = GenerationHyperparameters(max_new_tokens=16)
TASK = Task(task_id="t", instruction="Open Settings")
CLICK = (
    "<thinking>\ntap\n</thinking>\n<tool_call>\n"
    '{"name":"mobile_use","arguments":{"action":"click","coordinate":[299,399]}}\n</tool_call>'
)


def _step(image: PreparedImage) -> HistoryStep:
    return HistoryStep(image, get_dialect("mai_ui").parse(CLICK), CLICK)


def _image_urls(messages: list[dict]) -> list[str]:
    return [
        part["image_url"]["url"]
        for message in messages
        for part in message["content"]
        if part["type"] == "image_url"
    ]


@pytest.mark.parametrize("kernel", [True, False])
async def test_pixels_are_computed_once_per_image(
    processor, make_shots, monkeypatch: pytest.MonkeyPatch, kernel: bool
) -> None:
    builder = PromptBuilder(default_prompt_config("mai_ui"), processor)
    assert builder.pixel_kernel is not None
    if not kernel:
        builder.pixel_kernel = None
    calls: list[tuple[str, Image.Image]] = []
    original_kernel = pixels.PixelKernel.rows
    original_features = pixels.compute_features

    def counting_kernel(self, pixels, threads=1):
        calls.append(("kernel", pixels))
        return original_kernel(self, pixels, threads)

    def counting_features(image_processor, image):
        calls.append(("compute_features", image.image))
        return original_features(image_processor, image)

    monkeypatch.setattr(pixels.PixelKernel, "rows", counting_kernel)
    monkeypatch.setattr(pixels, "compute_features", counting_features)
    shots = make_shots(builder.sizing, 5)
    history: list[HistoryStep] = []
    for shot in shots:
        built = await builder.build(TASK, history, shot, GCONFIG)
        history.append(_step(shot))
    assert len(built.images) == 3
    # 1 + 2 + 3 + 3 + 3 images shown, each normalised once, by the chosen path.
    used = "kernel" if kernel else "compute_features"
    assert [name for name, _ in calls] == [used] * len(shots)
    for (_, seen), shot in zip(calls, shots, strict=True):
        assert seen is shot.image if not kernel else seen.tobytes() == shot.image.tobytes()
    # Turn 5 released turns 1-2 (never shown again); the window's images stay cached.
    assert [bool(s._cache) for s in shots] == [False, False, True, True, True]


@pytest.mark.parametrize("fixture", ["processor", "qwen25_processor"])
def test_patchify_equals_the_image_processor(
    request: pytest.FixtureRequest, screens, fixture: str
) -> None:
    processor = request.getfixturevalue(fixture)
    image_processor = processor.image_processor
    assert pixels.kernel_matches(image_processor)
    factor = image_processor.patch_size * image_processor.merge_size
    for width, height in [(factor, factor), (7 * factor, 3 * factor), (9 * factor, 20 * factor)]:
        image = prepare_image(screens[1].resize((width, height)), ImageSizing(factor, 1, 10**8))
        mine = pixels.patchify(image_processor, image.image)
        theirs = pixels.compute_features(image_processor, image)
        assert mine.pixel_values.dtype == theirs.pixel_values.dtype == torch.float32
        assert torch.equal(mine.pixel_values, theirs.pixel_values)
        assert torch.equal(mine.image_grid_thw, theirs.image_grid_thw)
        assert mine.image_grid_thw.dtype == theirs.image_grid_thw.dtype


def test_kernel_only_for_known_image_processors(processor) -> None:
    from transformers import Qwen2VLImageProcessorFast

    class CustomImageProcessor(Qwen2VLImageProcessorFast):
        pass

    assert not pixels.kernel_matches(CustomImageProcessor(patch_size=16, merge_size=2))
    assert pixels.kernel_matches(Qwen2VLImageProcessorFast(patch_size=16, merge_size=2))


def test_kernel_for_the_processor_under_its_newer_name() -> None:
    """transformers 5.17 names this processor ``Qwen2VLImageProcessor`` (``...Fast`` is a
    deprecated alias there); under that name the kernel is still chosen when the probe
    matches, and refused for transformers 5.3's slow processor of that name (its arithmetic
    differs: the probe says so)."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLImageProcessorFast

    renamed = type("Qwen2VLImageProcessor", (Qwen2VLImageProcessorFast,), {})
    assert pixels.kernel_matches(renamed(patch_size=16, merge_size=2))
    slow = Qwen2VLImageProcessor(patch_size=16, merge_size=2)
    if not isinstance(slow, Qwen2VLImageProcessorFast):  # transformers 5.3: numpy backend
        assert not pixels.kernel_matches(slow)


async def test_prepare_image_does_the_per_screenshot_work(processor, make_png) -> None:
    builder = PromptBuilder(default_prompt_config("mai_ui"), processor)
    timings: dict[str, float] = {}
    shot = await builder.prepare_image(Screenshot(png=make_png(1080, 2400)), timings=timings)
    assert set(timings) == {"decode", "resize", "pixels", "encode"}
    assert shot.is_encoded and pixels.image_processor_key(processor.image_processor) in shot._cache
    build_timings: dict[str, float] = {}
    await builder.build(TASK, [], shot, GCONFIG, timings=build_timings)
    assert set(build_timings) == {"template_tokenize", "assemble", "request"}


async def test_encode_images_false_encodes_nothing(processor, make_shots) -> None:
    config = default_prompt_config("mai_ui")
    lazy = PromptBuilder(config, processor, encode_images=False)
    eager = PromptBuilder(config, processor)
    shot = await lazy.prepare_image(Screenshot(image=Image.new("RGB", (1080, 2400), 9)))
    assert not shot.is_encoded
    shots = make_shots(lazy.sizing, 2)
    history = [_step(im) for im in shots]
    built = await lazy.build(TASK, history, shot, GCONFIG)
    assert not any(im.is_encoded for im in built.images)
    assert built.request.image_data == [] and built.request.vision_msg_vllm is None
    assert built.request.metadata["multi_modal_input"] is built.multi_modal_input
    assert _image_urls(built.messages) == [UNENCODED_IMAGE_URL] * 3
    encoded = await eager.build(TASK, history, shot, GCONFIG)
    assert encoded.input_ids == built.input_ids and encoded.text == built.text
    assert encoded.request.image_data == [im.png_base64 for im in built.images]
    assert _image_urls(encoded.messages) == [im.data_url for im in built.images]


async def test_request_tensors_are_concatenated_when_first_read(processor, make_shots) -> None:
    builder = PromptBuilder(default_prompt_config("mai_ui"), processor, encode_images=False)
    shots = make_shots(builder.sizing, 3)
    built = await builder.build(TASK, [_step(im) for im in shots[:2]], shots[2], GCONFIG)
    mm = built.request.metadata["multi_modal_input"]
    assert isinstance(mm, pixels.PromptTensors)
    assert list(mm) == ["pixel_values", "image_grid_thw", "mm_token_type_ids"] and len(mm) == 3
    assert "computed: []" in repr(mm)
    assert mm["mm_token_type_ids"].shape == (1, len(built.input_ids))
    assert "computed: ['mm_token_type_ids']" in repr(mm)  # the ids' types need no pixels
    assert mm["mm_token_type_ids"] is mm["mm_token_type_ids"]
    expected = pixels.concat_features(
        [pixels.image_features(processor.image_processor, im) for im in shots]
    )
    assert torch.equal(mm["pixel_values"], expected["pixel_values"])
    assert torch.equal(mm["image_grid_thw"], expected["image_grid_thw"])
    assert mm["pixel_values"] is mm["pixel_values"]  # concatenated once
    assert set(dict(mm)) == set(mm) and "video_grid_thw" not in mm
    with pytest.raises(KeyError):
        mm["pixel_values_videos"]


def test_expansion_mismatches_are_refused(processor, make_shots) -> None:
    builder = PromptBuilder(default_prompt_config("qwen3_vl"), processor)
    shot, other = make_shots(builder.sizing, 2)
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    tokenized = tokenize_prompt(processor, messages, [shot])
    with pytest.raises(PromptTokenMismatch, match="tokenized for 1 images, got 2"):
        expand_prompt(processor, tokenized, [shot, other])
    # An image whose claimed size disagrees with its pixels (grid 32x14 = 112 tokens).
    liar = replace(shot, model_size=(256, 512))
    with pytest.raises(PromptTokenMismatch, match="gives 112 tokens, the prepared image size 128"):
        expand_prompt(processor, tokenize_prompt(processor, messages, [liar]), [liar])
    with pytest.raises(ValueError, match="not a multiple of 32"):
        tokenize_prompt(processor, messages, [replace(shot, model_size=(230, 512))])


async def test_a_literal_pad_in_task_text_is_refused(processor, make_shots) -> None:
    builder = PromptBuilder(default_prompt_config("qwen3_vl"), processor)
    shot = make_shots(builder.sizing, 1)[0]
    sneaky = Task(task_id="t", instruction=f"say {processor.image_token}")
    with pytest.raises(PromptTokenMismatch, match="2 image pads for 1 images"):
        await builder.build(sneaky, [], shot, GCONFIG)


def test_fast_resize_keeps_the_exact_model_size(screens) -> None:
    settings = [(224, 512, 16 * 1024, 128 * 1024), (1088, 2400, 65536, 16777216)]
    for width, height, lo, hi in settings:
        sizing = ImageSizing(32, lo, hi)
        fast = resize_for_model(screens[0], sizing)
        plain = resize_for_model(screens[0], sizing, reducing_gap=None)
        assert fast.size == plain.size == (width, height)
        assert prepare_image(screens[0], sizing).image.tobytes() == fast.tobytes()
    smooth = Image.linear_gradient("L").resize((1080, 2400)).convert("RGB")
    sizing = ImageSizing(32, 16 * 1024, 128 * 1024)
    fast = resize_for_model(smooth, sizing).tobytes()
    plain = resize_for_model(smooth, sizing, reducing_gap=None).tobytes()
    assert max(abs(a - b) for a, b in zip(fast, plain, strict=True)) <= 4


@pytest.mark.parametrize(
    ("source", "lo", "hi"),
    [
        ((1080, 2400), 65536, 16777216),  # width only: 1088x2400, row bands
        ((1920, 1080), 65536, 16777216),  # height only: 1920x1088, column bands
        ((1080, 2400), 16 * 1024, 128 * 1024),  # both shrink (reduce first): one call
        ((1000, 2400), 65536, 16777216),  # width only, 1000 -> 992: shrinks
    ],
)
def test_banded_resize_is_the_whole_resize(
    screens, source: tuple[int, int], lo: int, hi: int
) -> None:
    image = screens[2].resize(source)
    sizing = ImageSizing(32, lo, hi)
    whole = resize_for_model(image, sizing)
    size = sizing.model_size(*source)
    one_side = (size[0] == source[0]) != (size[1] == source[1])
    assert (banded_resize(image, size, RESIZE_REDUCING_GAP, 3) is not None) == one_side
    for threads in (2, 3, 7):
        banded = resize_for_model(image, sizing, threads=threads)
        assert banded.size == whole.size and banded.mode == whole.mode
        assert banded.tobytes() == whole.tobytes()


@pytest.mark.parametrize("fixture", ["processor", "qwen25_processor"])
def test_pixel_rows_on_threads_are_the_same(
    request: pytest.FixtureRequest, screens, fixture: str
) -> None:
    image_processor = request.getfixturevalue(fixture).image_processor
    factor = image_processor.patch_size * image_processor.merge_size
    image = prepare_image(
        screens[3].resize((20 * factor, 9 * factor)), ImageSizing(factor, 1, 10**8)
    )
    kernel = pixels.PixelKernel.for_image_processor(image_processor)
    assert kernel is not None
    reference = pixels.compute_features(image_processor, image)
    for threads in (1, 2, 4, 50):
        mine = kernel(image.image, threads=threads)
        assert torch.equal(mine.pixel_values, reference.pixel_values)
        assert torch.equal(mine.image_grid_thw, reference.image_grid_thw)
    keyed = [
        pixels.image_features(
            image_processor, replace(image, source_url=None), kernel=kernel, threads=threads
        )
        for threads in (1, 3)
    ]
    without = pixels.image_features(image_processor, replace(image, source_url=None))
    assert keyed[0].content_key == keyed[1].content_key == without.content_key is not None


def _every_value_image(factor: int) -> np.ndarray:
    """A 2x3 grid of merge blocks whose channels each run through all 256 uint8 values, each
    in its own order (so the channels of one pixel differ)."""
    height, width = 3 * factor, 2 * factor
    index = np.arange(height * width).reshape(height, width)
    orders = ((1, 0), (7, 101), (255, 33))  # steps coprime to 256: every value, each channel
    values = np.stack([(index * step + shift) % 256 for step, shift in orders], axis=-1)
    return values.astype(np.uint8)


@pytest.mark.parametrize("fixture", ["processor", "qwen25_processor", "rescale_only"])
def test_rows_equal_the_image_processor_for_every_uint8_value(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    if fixture == "rescale_only":
        from transformers import Qwen2VLImageProcessorFast

        image_processor = Qwen2VLImageProcessorFast(patch_size=14, merge_size=2, do_normalize=False)
    else:
        image_processor = request.getfixturevalue(fixture).image_processor
    kernel = pixels.PixelKernel.for_image_processor(image_processor)
    assert kernel is not None
    values = _every_value_image(image_processor.patch_size * image_processor.merge_size)
    for channel in range(3):
        assert np.unique(values[..., channel]).tolist() == list(range(256))
    height, width = values.shape[:2]
    image = PreparedImage(Image.fromarray(values, "RGB"), (width, height), (width, height))
    theirs = pixels.compute_features(image_processor, image).pixel_values
    assert theirs.dtype == torch.float32

    def same_bits(mine: torch.Tensor) -> bool:
        return mine.shape == theirs.shape and torch.equal(
            mine.view(torch.int32), theirs.view(torch.int32)
        )

    for threads in (1, 2, 3):
        assert same_bits(kernel.rows(values, threads).pixel_values)
        poisoned = torch.full_like(theirs, float("nan"))  # every element must be written
        written = kernel.rows(values, threads, out=poisoned).pixel_values
        assert written is poisoned and same_bits(written)
    with pytest.raises(ValueError, match="contiguous float32"):
        kernel.rows(values, out=torch.empty(theirs.shape, dtype=torch.float64))
