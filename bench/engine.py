"""Throughput of the in-process engine on the tiny Qwen3-VL (CPU): sequential vs concurrent.

Prompt: one 1080×2400 screenshot (tiny pixel budget: 112 image tokens) plus an instruction.
Run: ``uv run python bench/engine.py [--requests 8] [--new-tokens 64]``.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

import torch
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest
from PIL import Image

from cua_native.engine import InProcessEngine
from cua_native.models.tiny import build_tiny_qwen3_vl


def build_request(engine: InProcessEngine, new_tokens: int, seed: int) -> ModelRequest:
    processor = engine.processor
    image = Image.new("RGB", (1080, 2400), (30, 140, 210))
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Open Settings"}]}
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    out = processor(text=[text], images=[image], return_tensors="pt")
    return ModelRequest(
        input_ids=out["input_ids"][0].tolist(),
        processor=processor,
        tokenizer=processor.tokenizer,
        gconfig=GenerationHyperparameters(max_new_tokens=new_tokens, ignore_eos=True),
        metadata={
            "multi_modal_input": {
                "pixel_values": out["pixel_values"],
                "image_grid_thw": out["image_grid_thw"],
            },
            "seed": seed,
        },
    )


async def run(engine: InProcessEngine, n: int, new_tokens: int, concurrent: bool) -> None:
    reqs = [build_request(engine, new_tokens, seed) for seed in range(n)]
    start = time.perf_counter()
    if concurrent:
        resps = await asyncio.gather(*(engine.agenerate(r) for r in reqs))
    else:
        resps = [await engine.agenerate(r) for r in reqs]
    wall = time.perf_counter() - start
    tokens = sum(len(r.output_tokens) for r in resps)
    mode = f"{n} concurrent" if concurrent else f"{n} sequential"
    print(
        f"{mode:>14}: {tokens / wall:8.1f} tok/s  {1000 * wall / n:7.1f} ms/turn (wall/n)  "
        f"mean latency {1000 * sum(r.latency for r in resps) / n:7.1f} ms  "
        f"mean ttft {1000 * sum(r.ttft for r in resps) / n:6.1f} ms  "
        f"prompt {len(reqs[0].input_ids)} tok"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    print(f"torch threads: {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_qwen3_vl(tmp)
        engine = InProcessEngine.from_pretrained(path, max_batch_size=args.requests)
        try:
            asyncio.run(run(engine, 2, 8, concurrent=False))  # warm-up
            asyncio.run(run(engine, args.requests, args.new_tokens, concurrent=False))
            asyncio.run(run(engine, args.requests, args.new_tokens, concurrent=True))
        finally:
            engine.destroy()


if __name__ == "__main__":
    main()
