"""CPU A/B of ``LocalTrainEngine``'s PPO step against another revision's.

Loads ``cua_native/training/local_engine.py`` from ``--baseline`` (the root of another
checkout) beside this checkout's, in one process, and times what the embedded trainer does per
step on the same rows: the recomputed log-probs (``forward_batch``) and the update
(``train_batch`` with AReaL's GRPO loss), on the tiny Qwen3-VL at the embedded default's sizes
(a 160×384 screenshot, a ``--prompt-tokens`` prompt, ``--output-tokens`` trained tokens).
The revisions alternate rep by rep, so a loaded machine slows both alike. Prints medians, the
ratio (this / baseline; below 1 is faster) and the largest log-prob difference between them.

    uv run python bench/perf/train_step_ab.py --baseline ../base [--rows 16] [--reps 5]
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from areal.trainer.ppo.actor import grpo_loss_fn
from areal.utils.data import concat_padded_tensors
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from bench.perf.revision import load
from cua_native.models.tiny import build_tiny_qwen3_vl
from cua_native.training import local_engine


def make_row(
    processor: Any, vocab: int, prompt_tokens: int, output_tokens: int, seed: int
) -> dict[str, Any]:
    """One turn as the workflow emits it, with AReaL's already-rolled update fields."""
    gen = torch.Generator().manual_seed(seed)
    image = Image.new("RGB", (160, 384), (seed * 37 % 255, 90, 160))
    text = "<|vision_start|><|image_pad|><|vision_end|>" + "Open Settings and turn on Wi-Fi. " * 200
    enc = processor(text=[text], images=[image], return_tensors="pt")
    n_image = int((enc["input_ids"][0] == processor.image_token_id).sum())
    prompt = enc["input_ids"][0, : max(prompt_tokens, n_image + 8)]
    output = torch.randint(10, vocab, (output_tokens,), generator=gen)
    ids = torch.cat([prompt, output])[None]
    n = ids.shape[1]
    mask = torch.tensor([[0] * prompt.shape[0] + [1] * output_tokens], dtype=torch.int32)
    rolled = torch.roll(mask, -1, -1)
    logprobs = -torch.rand(1, n, generator=gen) * rolled
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids, dtype=torch.bool),
        "loss_mask": rolled,
        "logprobs": logprobs,
        "prox_logp": logprobs.clone(),
        "advantages": torch.randn(1, n, generator=gen) * rolled,
        "mm_token_type_ids": torch.cat(
            [
                enc["mm_token_type_ids"][0, : prompt.shape[0]],
                torch.zeros(output_tokens, dtype=torch.long),
            ]
        )[None],
        "multi_modal_input": [
            {"pixel_values": enc["pixel_values"], "image_grid_thw": enc["image_grid_thw"]}
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout's root")
    parser.add_argument("--rows", type=int, default=16, help="turns per step")
    parser.add_argument("--prompt-tokens", type=int, default=1100)
    parser.add_argument("--output-tokens", type=int, default=40)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    path = args.baseline / "cua_native" / "training" / "local_engine.py"
    if not path.is_file() or args.reps < 1 or args.rows < 1:
        raise SystemExit(f"no {path}, or reps/rows < 1")
    old = load("baseline_local_engine", path)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_qwen3_vl(Path(tmp) / "tiny")
        processor = AutoProcessor.from_pretrained(model_dir)
        model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    batch = concat_padded_tensors(
        [
            make_row(
                processor,
                model.config.text_config.vocab_size,
                args.prompt_tokens,
                args.output_tokens,
                s,
            )
            for s in range(args.rows)
        ]
    )
    loss_fn = functools.partial(grpo_loss_fn, eps_clip=0.2, eps_clip_higher=None, c_clip=None)

    def weight(row: dict[str, Any]) -> torch.Tensor:
        return row["loss_mask"].sum()

    engines = {
        "baseline": old.LocalTrainEngine(copy.deepcopy(model), lr=0.0),
        "this": local_engine.LocalTrainEngine(copy.deepcopy(model), lr=0.0),
    }
    times: dict[str, dict[str, list[float]]] = {k: {"logp": [], "update": []} for k in engines}
    logps: dict[str, torch.Tensor] = {}
    print(
        f"torch threads: {torch.get_num_threads()}, rows {args.rows}, "
        f"{args.prompt_tokens} prompt + {args.output_tokens} output tokens each"
    )
    for rep in range(args.reps + 1):  # rep 0 warms up
        order = list(engines) if rep % 2 else list(reversed(engines))
        for name in order:
            engine = engines[name]
            start = time.perf_counter()
            logps[name] = engine.forward_batch(batch)
            middle = time.perf_counter()
            engine.train_batch(batch, loss_fn, weight)
            end = time.perf_counter()
            if rep:
                times[name]["logp"].append(middle - start)
                times[name]["update"].append(end - middle)
    reads = batch["loss_mask"].bool()  # rolled: the positions whose log-prob the loss reads
    gap = float((logps["this"] - logps["baseline"])[reads].abs().max())
    for phase in ("logp", "update"):
        base = statistics.median(times["baseline"][phase])
        this = statistics.median(times["this"][phase])
        print(f"{phase:>7}: baseline {base:.3f} s, this {this:.3f} s, ratio {this / base:.2f}")
    total_b = statistics.median(a + b for a, b in zip(*times["baseline"].values(), strict=True))
    total_t = statistics.median(a + b for a, b in zip(*times["this"].values(), strict=True))
    print(f"  total: baseline {total_b:.3f} s, this {total_t:.3f} s, ratio {total_t / total_b:.2f}")
    print(f"largest |log-prob difference| on read positions: {gap:.2e}")


if __name__ == "__main__":
    main()
