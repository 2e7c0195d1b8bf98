"""PromptBuilder end to end on the tiny Qwen3-VL processor: exact ids, budgets, requests."""

from __future__ import annotations

import asyncio
import base64
import io

import httpx
import pytest
from areal.api.cli_args import GenerationHyperparameters
from areal.engine.vllm_remote import VLLMBackend
from PIL import Image

from cua_native.actions.dialects import get_dialect
from cua_native.gym.media import MediaNotAllowed
from cua_native.gym.protocol import Screenshot, Task
from cua_native.prompts import (
    HistoryStep,
    ImageDecodeError,
    PromptBuilder,
    PromptTooLong,
    default_prompt_config,
)

GCONFIG = GenerationHyperparameters(max_new_tokens=16)
CLICK = (
    "<thinking>\n点击 Wi-Fi 🙂\n</thinking>\n<tool_call>\n"
    '{"name":"mobile_use","arguments":{"action":"click","coordinate":[299,399]}}\n</tool_call>'
)


def _history(builder: PromptBuilder, images) -> list[HistoryStep]:
    dialect = get_dialect("mai_ui")
    return [HistoryStep(im, dialect.parse(CLICK), CLICK) for im in images]


async def _shots(builder: PromptBuilder, make_png, n: int):
    return [
        await builder.prepare_image(Screenshot(png=make_png(1080, 2400, (i * 40 % 256, 10, 10))))
        for i in range(n)
    ]


def _pad_count(processor, ids: list[int]) -> int:
    pad = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    return sum(1 for t in ids if t == pad)


async def test_prompt_shape_and_unicode(processor, make_shots) -> None:
    task = Task(task_id="t", instruction="打开设置并开启 Wi-Fi 🙂 " + "long instruction " * 400)
    builder = PromptBuilder(default_prompt_config("mai_ui"), processor)
    shots = make_shots(builder.sizing, 4)
    built = await builder.build(task, _history(builder, shots[:3]), shots[3], GCONFIG)
    assert [im.model_size for im in built.images] == [(224, 512)] * 3
    grid = built.multi_modal_input["image_grid_thw"]
    assert grid.tolist() == [[1, 32, 14]] * 3
    assert built.multi_modal_input["pixel_values"].shape == (3 * 448, 1536)
    assert _pad_count(processor, built.input_ids) == int(grid.prod(-1).sum()) // 4 == 3 * 112
    decoded = processor.tokenizer.decode(built.input_ids)
    assert task.instruction in decoded and "点击 Wi-Fi 🙂" in decoded
    assert built.dropped == {"images": 0, "turns": 0}


async def test_multi_turn_has_no_double_expansion(processor, make_shots) -> None:
    builder = PromptBuilder(default_prompt_config("qwen3_vl", history_images=2), processor)
    shots = make_shots(builder.sizing, 3)
    task = Task(task_id="t", instruction="Open Settings")
    dialect = get_dialect("qwen3_vl")
    text = '<tool_call>\n{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [1, 2]}}\n</tool_call>'
    history: list[HistoryStep] = []
    for turn in range(3):
        built = await builder.build(task, history, shots[turn], GCONFIG)
        expected = len(built.images) * 112
        assert _pad_count(processor, built.input_ids) == expected
        assert built.multi_modal_input["mm_token_type_ids"][0].sum().item() == expected
        assert len(built.images) == min(turn + 1, 2)
        history.append(HistoryStep(shots[turn], dialect.parse(text), text))


async def test_budget_drops_oldest_images_then_turns(processor, make_shots) -> None:
    task = Task(task_id="t", instruction="Open Settings")
    base = PromptBuilder(default_prompt_config("mai_ui", history_images=4), processor)
    shots = make_shots(base.sizing, 5)
    history = _history(base, shots[:4])
    full = await base.build(task, history, shots[4], GCONFIG)
    assert len(full.images) == 4 and full.dropped == {"images": 0, "turns": 0}
    size = len(full.input_ids)

    async def build(limit: int):
        config = default_prompt_config("mai_ui", history_images=4, max_context_tokens=limit)
        return await PromptBuilder(config, processor).build(task, history, shots[4], GCONFIG)

    one = await build(size - 1)
    assert one.dropped == {"images": 1, "turns": 0} and one.images == shots[2:5]
    assert len(one.input_ids) <= size - 1
    no_past = await build(size - 3 * 112)
    assert no_past.dropped == {"images": 3, "turns": 0} and no_past.images == [shots[4]]
    turns = await build(len(no_past.input_ids) - 1)
    assert turns.dropped["images"] == 3 and turns.dropped["turns"] >= 1
    assert turns.images == [shots[4]]
    assert sum(m["role"] == "assistant" for m in turns.messages) == 4 - turns.dropped["turns"]
    assert turns.messages[1]["content"][0]["text"] == "Open Settings"  # the task stays
    with pytest.raises(PromptTooLong, match="max_context_tokens=50"):
        await build(50)


async def test_max_images_cap(processor, make_shots) -> None:
    builder = PromptBuilder(default_prompt_config("mai_ui", max_images=2), processor)
    shots = make_shots(builder.sizing, 4)
    built = await builder.build(Task(task_id="t"), _history(builder, shots[:3]), shots[3], GCONFIG)
    assert built.images == shots[2:] and built.dropped == {"images": 1, "turns": 0}


async def test_model_request_for_areal_engines(processor, make_png) -> None:
    builder = PromptBuilder(default_prompt_config("mai_ui"), processor)
    shots = await _shots(builder, make_png, 2)
    built = await builder.build(
        Task(task_id="t", instruction="x"), _history(builder, shots[:1]), shots[1], GCONFIG
    )
    req = built.request
    assert req.input_ids == built.input_ids and req.gconfig is GCONFIG
    assert req.processor is processor and req.tokenizer is processor.tokenizer
    assert req.metadata["multi_modal_input"] is built.multi_modal_input
    assert req.metadata["dropped"] == built.dropped
    decoded = [Image.open(io.BytesIO(base64.b64decode(b))) for b in req.image_data]
    assert [im.size for im in decoded] == [im.model_size for im in built.images]
    assert decoded[1].convert("RGB").tobytes() == built.images[1].image.tobytes()
    payload = VLLMBackend().build_generation_request(req, with_lora=False, version=0).payload
    urls = [
        p["image_url"]["url"]
        for m in payload["messages"]
        for p in m["content"]
        if p["type"] == "image_url"
    ]
    assert urls == [f"data:image/png;base64,{b}" for b in req.image_data]
    assert built.messages[2]["content"][0]["image_url"]["url"] == built.images[0].data_url


async def test_prepare_image_inputs(processor, make_png) -> None:
    builder = PromptBuilder(default_prompt_config("qwen3_vl"), processor)
    rgba = await builder.prepare_image(Screenshot(png=make_png(100, 60, (0, 0, 0, 0), "RGBA")))
    assert rgba.image.mode == "RGB" and rgba.original_size == (100, 60)
    assert rgba.image.getpixel((5, 5)) == (255, 255, 255)  # transparency on white
    pil = await builder.prepare_image(Screenshot(image=Image.new("L", (1080, 2400), 7)))
    assert pil.model_size == (224, 512) and pil.original_size == (1080, 2400)
    custom = PromptBuilder(
        default_prompt_config("qwen3_vl", min_pixels=256 * 1024, max_pixels=1280 * 1024), processor
    )
    big = await custom.prepare_image(Screenshot(png=make_png(1080, 2400)))
    assert big.model_size == (768, 1696)  # smart_resize(2400, 1080, 32, 256·32², 1280·32²)
    built = await custom.build(Task(task_id="t"), [], big, GCONFIG)
    assert built.multi_modal_input["image_grid_thw"].tolist() == [[1, 106, 48]]
    with pytest.raises(ImageDecodeError, match="not a decodable image"):
        await builder.prepare_image(Screenshot(png=b"not a png"))


async def test_url_screenshots_are_allow_listed(processor, make_png) -> None:
    data = make_png(1080, 2400)
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, content=data)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        builder = PromptBuilder(
            default_prompt_config("qwen3_vl"),
            processor,
            http=http,
            allowed_media_domains=["127.0.0.1"],
        )
        ok = await builder.prepare_image(Screenshot(url="http://127.0.0.1/shot.png"))
        assert ok.model_size == (224, 512) and ok.source_url == "http://127.0.0.1/shot.png"
        built = await builder.build(Task(task_id="t"), [], ok, GCONFIG)
        assert built.messages[1]["content"][1]["image_url"]["url"] == "http://127.0.0.1/shot.png"
        assert built.request.image_data == [ok.png_base64]
        for url in (
            "http://169.254.169.254/latest",
            "file:///etc/passwd",
            "http://evil.example/x.png",
        ):
            with pytest.raises(MediaNotAllowed):
                await builder.prepare_image(Screenshot(url=url))
    assert seen == ["http://127.0.0.1/shot.png"]
    no_list = PromptBuilder(default_prompt_config("qwen3_vl"), processor)
    with pytest.raises(MediaNotAllowed, match=r"host '127\.0\.0\.1' is not in the allowed"):
        await no_list.prepare_image(Screenshot(url="http://127.0.0.1/shot.png"))
    no_client = PromptBuilder(
        default_prompt_config("qwen3_vl"), processor, allowed_media_domains=["127.0.0.1"]
    )
    with pytest.raises(ValueError, match="needs PromptBuilder"):
        await no_client.prepare_image(Screenshot(url="http://127.0.0.1/shot.png"))


async def test_work_runs_off_the_event_loop(processor, make_png) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="prompt-test") as pool:
        builder = PromptBuilder(default_prompt_config("qwen3_vl"), processor, executor=pool)
        loop_ticks = 0

        async def ticker() -> None:
            nonlocal loop_ticks
            while True:
                loop_ticks += 1
                await asyncio.sleep(0)

        tick = asyncio.create_task(ticker())
        try:
            image = await builder.prepare_image(Screenshot(png=make_png(2160, 4800)))
            await builder.build(Task(task_id="t"), [], image, GCONFIG)
        finally:
            tick.cancel()
        assert loop_ticks > 3


async def test_build_turn_is_prepare_then_build(processor, make_png) -> None:
    """One hand-off (``build_turn``) gives what ``prepare_image`` + ``build`` give, and the
    prompt's pixels by reference concatenate to the request's tensors."""
    builder = PromptBuilder(default_prompt_config("mai_ui"), processor)
    task = Task(task_id="t", instruction="open settings")
    shots = await _shots(builder, make_png, 2)
    history = _history(builder, shots)
    screenshot = Screenshot(png=make_png(1080, 2400, (7, 200, 9)))
    together = await builder.build_turn(task, history, screenshot, GCONFIG)
    prepared = await builder.prepare_image(screenshot)
    apart = await builder.build(task, history, prepared, GCONFIG)
    assert together.input_ids == apart.input_ids
    assert together.current is not None
    assert together.current.model_size == prepared.model_size
    again = await builder.build_turn(task, history, together.current, GCONFIG)
    assert again.input_ids == apart.input_ids
    for built in (together, apart):
        kept = built.pixels.tensors()
        for key in ("pixel_values", "image_grid_thw"):
            assert kept[key].equal(built.multi_modal_input[key])
