"""Throughput of the in-process engine on the tiny Qwen3-VL (CPU): sequential vs concurrent,
each decoder side by side (``slots``: continuous batching over the slot KV cache; ``legacy``:
static batches over transformers' DynamicCache), with the ratios slots / legacy.

Prompt: one 1080×2400 screenshot (tiny pixel budget: 112 image tokens) plus an instruction.
Run: ``uv run python bench/perf/engine.py [--requests 8] [--new-tokens 64] [--rounds 3]``.
Each (decoder, mode) runs ``--rounds`` times, interleaved; the best round counts.
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


async def run(
    engine: InProcessEngine, n: int, new_tokens: int, concurrent: bool
) -> dict[str, float]:
    reqs = [build_request(engine, new_tokens, seed) for seed in range(n)]
    start = time.perf_counter()
    if concurrent:
        resps = await asyncio.gather(*(engine.agenerate(r) for r in reqs))
    else:
        resps = [await engine.agenerate(r) for r in reqs]
    wall = time.perf_counter() - start
    tokens = sum(len(r.output_tokens) for r in resps)
    return {
        "tok_s": tokens / wall,
        "latency_ms": 1000 * sum(r.latency for r in resps) / n,
        "ttft_ms": 1000 * sum(r.ttft for r in resps) / n,
        "prompt": len(reqs[0].input_ids),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if min(args.requests, args.new_tokens, args.rounds) < 1:
        raise SystemExit("--requests, --new-tokens and --rounds must be >= 1")
    print(f"torch threads: {torch.get_num_threads()}")
    decoders = ("slots", "legacy")
    modes = (("sequential", False), ("concurrent", True))
    best: dict[tuple[str, str], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_qwen3_vl(tmp)
        engines = {
            d: InProcessEngine.from_pretrained(path, max_batch_size=args.requests, decoder=d)
            for d in decoders
        }
        try:
            for engine in engines.values():
                asyncio.run(run(engine, 2, 8, concurrent=False))  # warm-up
            for _ in range(args.rounds):
                for decoder, engine in engines.items():
                    for mode, concurrent in modes:
                        got = asyncio.run(run(engine, args.requests, args.new_tokens, concurrent))
                        key = (decoder, mode)
                        if key not in best or got["tok_s"] > best[key]["tok_s"]:
                            best[key] = got
        finally:
            for engine in engines.values():
                engine.destroy()
    n = args.requests
    for (decoder, mode), got in best.items():
        print(
            f"{decoder:>6} {n} {mode:>10}: {got['tok_s']:8.1f} tok/s  mean latency "
            f"{got['latency_ms']:7.1f} ms  mean ttft {got['ttft_ms']:6.1f} ms  "
            f"prompt {got['prompt']:.0f} tok"
        )
    for mode, _ in modes:
        new, old = best[("slots", mode)], best[("legacy", mode)]
        print(
            f"slots / legacy, {mode:>10}: tok/s x{new['tok_s'] / old['tok_s']:.2f}, "
            f"ttft x{new['ttft_ms'] / old['ttft_ms']:.2f} (lower is better)"
        )


if __name__ == "__main__":
    main()
