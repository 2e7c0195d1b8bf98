"""Where the train step's time goes at the GPU rehearsal's shape (issue 41's train-step goal).

Builds the 2B-sized random Qwen3-VL of ``bench/gpu/gpu_check.py`` (bf16, on the GPU) and times, with
CUDA events, one training row of the rehearsal's kind — a per-turn row whose prompt carries
``n`` screenshots at Qwen3-VL's real budget (1088x2400: 10,200 patches, 2,550 image tokens
each) and ``--output`` trained tokens — split into its parts:

- the vision tower alone (forward, forward+backward);
- the language model alone on a row of the same length (``inputs_embeds``; forward+backward);
- the whole model (pixels in, loss on the output tokens; forward+backward);

and prints beside each its FLOPs and the share of the GPU's bf16 peak they reach, plus the share
of the row's tokens that carry loss. Writes ``OUT/train_step_profile.json``.

    python bench/gpu/train_step_profile.py --out OUT [--images 1 3] [--output 32] [--peak-tflops 989]
"""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path
from typing import Any

GRID = (1, 150, 68)  # a 1088x2400 screenshot in 16-pixel patches
PATCH_DIM = 3 * 2 * 16 * 16  # channels x temporal patch x patch x patch
TEXT_BEFORE, TEXT_BETWEEN = 300, 60


def _timed(fn: Any, repeat: int) -> float:
    """Median milliseconds of ``fn()`` over ``repeat`` runs after one warm-up."""
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _params(module: Any, skip: tuple[str, ...] = ()) -> int:
    return sum(p.numel() for n, p in module.named_parameters() if not any(s in n for s in skip))


def profile(model: Any, tokenizer: Any, images: int, output: int, repeat: int) -> dict[str, Any]:
    import torch

    device = next(model.parameters()).device
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    start = tokenizer.convert_tokens_to_ids("<|vision_start|>")
    end = tokenizer.convert_tokens_to_ids("<|vision_end|>")
    per_image = GRID[0] * GRID[1] * GRID[2] // 4
    ids: list[int] = [100] * TEXT_BEFORE
    for _ in range(images):
        ids += [start] + [pad] * per_image + [end] + [101] * TEXT_BETWEEN
    ids += [102] * output
    input_ids = torch.tensor([ids], device=device)
    labels = torch.full_like(input_ids, -100)
    labels[0, -output:] = input_ids[0, -output:]
    patches = GRID[0] * GRID[1] * GRID[2] * images
    pixels = torch.randn(patches, PATCH_DIM, device=device, dtype=torch.bfloat16)
    grid = torch.tensor([GRID] * images, device=device)
    visual = model.model.visual
    language = model.model.language_model
    tokens = len(ids)

    def vision_forward() -> None:
        with torch.no_grad():
            visual(pixels, grid_thw=grid)

    def vision_train() -> None:
        out = visual(pixels.requires_grad_(False), grid_thw=grid)
        first = out[0] if isinstance(out, tuple) else getattr(out, "pooler_output", out)
        first.float().sum().backward()

    embeds = torch.randn(
        1, tokens, language.config.hidden_size, device=device, dtype=torch.bfloat16
    )

    def language_train() -> None:
        hidden = language(inputs_embeds=embeds).last_hidden_state
        logits = model.lm_head(hidden[:, -output - 1 : -1])
        torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), input_ids[0, -output:]
        ).backward()

    extra: dict[str, Any] = {}
    if "mm_token_type_ids" in inspect.signature(model.model.forward).parameters:
        extra["mm_token_type_ids"] = (input_ids == pad).long()  # newer transformers: 1 = image

    def whole_train() -> None:
        out = model(
            input_ids=input_ids, pixel_values=pixels, image_grid_thw=grid, labels=labels, **extra
        )
        out.loss.backward()

    torch.cuda.reset_peak_memory_stats()
    figures = {}
    for name, part in (
        ("vision_forward_ms", vision_forward),
        ("vision_train_ms", vision_train),
        ("language_train_ms", language_train),
        ("whole_train_ms", whole_train),
    ):
        figures[name] = _timed(part, repeat)
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
    lm_params = _params(language, skip=("embed_tokens",))
    vision_params = _params(visual)
    text_cfg = language.config
    attn_dim = text_cfg.num_attention_heads * text_cfg.head_dim
    # 6 FLOPs per parameter per token (forward + backward) plus causal attention's score and
    # value products (forward 2 x 2 x T^2/2 x d per layer, backward twice that)
    lm_flops = 6 * lm_params * tokens + 6 * text_cfg.num_hidden_layers * tokens**2 * attn_dim
    vcfg = visual.config
    vision_flops = (
        6 * vision_params * patches
        + 12 * vcfg.depth * images * ((GRID[0] * GRID[1] * GRID[2]) ** 2) * vcfg.hidden_size
    )
    return {
        "images": images,
        "tokens": tokens,
        "patches": patches,
        "loss_tokens": output,
        "loss_token_share": output / tokens,
        "language_params": lm_params,
        "vision_params": vision_params,
        "language_train_tflop": lm_flops / 1e12,
        "vision_train_tflop": vision_flops / 1e12,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        **figures,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--images", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--output", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--vision-depth", type=int, default=24)
    parser.add_argument(
        "--checkpointing",
        action="store_true",
        help="gradient checkpointing (AReaL: actor.gradient_checkpointing, off by default)",
    )
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak")
    args = parser.parse_args()
    import torch
    from transformers import AutoTokenizer

    from bench.gpu.gpu_check import real_size_model
    from cua_native.rollout.factories import tiny_model_dir

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir(out / "cache"))
    model_args = argparse.Namespace(real_layers=args.layers, real_vision_depth=args.vision_depth)
    model = real_size_model(tokenizer, torch.device("cuda"), model_args)
    model.train()
    if args.checkpointing:
        model.gradient_checkpointing_enable()
    rows = []
    for images in args.images:
        row = profile(model, tokenizer, images, args.output, args.repeat)
        for part, flop_key in (
            ("vision_train_ms", "vision_train_tflop"),
            ("language_train_ms", "language_train_tflop"),
        ):
            row[part.replace("_ms", "_peak_share")] = (
                row[flop_key] / (row[part] / 1e3) / args.peak_tflops
            )
        whole_flop = row["vision_train_tflop"] + row["language_train_tflop"]
        row["whole_train_peak_share"] = (
            whole_flop / (row["whole_train_ms"] / 1e3) / args.peak_tflops
        )
        row["trained_tokens_per_s"] = args.output / (row["whole_train_ms"] / 1e3)
        rows.append(row)
        print(
            f"{images} image(s), {row['tokens']} tokens ({row['loss_token_share']:.2%} carry loss): "
            f"whole {row['whole_train_ms']:.0f} ms = {row['whole_train_peak_share']:.1%} of "
            f"{args.peak_tflops:.0f} TFLOP/s; vision {row['vision_train_ms']:.0f} ms "
            f"({row['vision_train_peak_share']:.1%}), language {row['language_train_ms']:.0f} ms "
            f"({row['language_train_peak_share']:.1%}); peak {row['peak_memory_gib']:.1f} GiB; "
            f"attention {row['attn_implementation']}",
            flush=True,
        )
    result = {
        "device": torch.cuda.get_device_name(0),
        "peak_tflops": args.peak_tflops,
        "rows": rows,
    }
    (out / "train_step_profile.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
