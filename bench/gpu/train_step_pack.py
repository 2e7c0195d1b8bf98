"""The FSDP actor's train step on the GPU rehearsal's rows: today vs packed vs packed + vision once.

Issue 41's train-step goal. Runs AReaL's own FSDP actor (``CUAFSDPPPOActor``, one process,
``sdpa``) three ways on the same rows and weights:

- ``today``: one row per micro-batch, every copy of a screenshot through the vision tower (the
  actor before packing: ``pack_rows`` and ``vision_once`` off);
- ``packed``: AReaL packs the rows into micro-batches by tokens, ``PACKED_SDPA`` keeps them
  apart; each copy still encoded;
- ``packed_vision_once``: packed, and each distinct screenshot encoded once per micro-batch
  (what the actor does now).

(Vision once without packing has nothing to share: a one-row micro-batch holds each screenshot
once.) The rows are the rehearsal's (``bench/gpu/gpu_rehearsal.py``, configs/qwen3_vl_android.yaml
scaled as ``--rehearse`` scales it): ``--tasks`` tasks x ``--group`` episodes x ``--turns``
turns, each turn a row whose prompt carries the last ``--history`` + 1 screenshots at
Qwen3-VL's real budget (1088x2400: 10,200 patches, 2,550 image tokens), ``--text`` prompt text
tokens and ``--output`` trained tokens; the episodes of a task start from one screen, later
screens differ. The model is the rehearsal's 2.1 B random Qwen3-VL (``gpu_rehearsal.build_model``).

Per way: the train step (AReaL's ``train_batch``: forward, backward, optimizer), timed over
``--repeat`` steps after one warm-up; the no-grad recompute of log-probs (``forward_batch``);
trained tokens/s (every token of the rows, as the rehearsal counts them) and loss tokens/s;
the model FLOPs of the step actually executed and their share of ``--peak-tflops``; peak memory;
and the max |log-p difference| against ``today`` on the same initial weights (every position of
every row, and the trained positions alone) plus the first step's gradient norms. Writes
``OUT/train_step_pack.json``.

    bash .device/run.sh python3 bench/gpu/train_step_pack.py --out OUT
    uv run python bench/gpu/train_step_pack.py --device cpu --tiny --out OUT     # smoke, minutes
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REAL_GRID = (1, 150, 68)
"""A 1088x2400 screenshot in 16-pixel patches."""
TINY_GRID = (1, 8, 6)
MODES = ("today", "packed", "packed_vision_once")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def episode_rows(
    tasks: int, group: int, turns: int, history: int
) -> list[tuple[str, list[tuple[int, ...]]]]:
    """Per row: its episode's name and the screenshots its prompt carries (keys), oldest
    first. A task's episodes share their first screen."""
    rows = []
    for task in range(tasks):
        for episode in range(group):
            screens = [(task, -1, 0)] + [(task, episode, t) for t in range(1, turns)]
            for turn in range(turns):
                window = screens[max(0, turn - history) : turn + 1]
                rows.append((f"task{task}/episode{episode}", window))
    return rows


def build_batch(
    model_config: Any,
    tokenizer: Any,
    rows: list[tuple[str, list[tuple[int, ...]]]],
    grid: tuple[int, int, int],
    text: int,
    output: int,
    seed: int,
) -> dict[str, Any]:
    """AReaL's padded batch of ``rows`` with random pixel rows per screenshot."""
    import torch

    vision = model_config.vision_config
    patch_dim = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    merge = vision.spatial_merge_size
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    start = tokenizer.convert_tokens_to_ids("<|vision_start|>")
    end = tokenizer.convert_tokens_to_ids("<|vision_end|>")
    per_image = grid[0] * grid[1] * grid[2] // (merge * merge)
    patches = grid[0] * grid[1] * grid[2]
    pixels: dict[tuple[int, ...], Any] = {}
    generator = torch.Generator().manual_seed(seed)
    # text ids below every special token (the image pads and vision markers among them)
    special = min(tokenizer.get_added_vocab().values(), default=len(tokenizer))
    vocab = min(int(model_config.text_config.vocab_size), len(tokenizer), special)
    seqs, loss_masks, mms = [], [], []
    for _, window in rows:
        ids = torch.randint(10, vocab // 2, (text,), generator=generator).tolist()
        for key in window:
            if key not in pixels:
                pixels[key] = torch.randn(patches, patch_dim, generator=generator)
            ids += [start] + [pad] * per_image + [end]
            ids += torch.randint(10, vocab // 2, (16,), generator=generator).tolist()
        ids += torch.randint(10, vocab // 2, (output,), generator=generator).tolist()
        seqs.append(ids)
        # AReaL's PPO actor trains position i on token i + 1 (its loss mask rolled by one):
        # the positions that predict the output tokens
        loss_masks.append([0] * (len(ids) - output - 1) + [1] * output + [0])
        mms.append(
            {
                "pixel_values": torch.cat([pixels[k] for k in window]),
                "image_grid_thw": torch.tensor([grid] * len(window)),
            }
        )
    longest = max(len(s) for s in seqs)
    n = len(seqs)
    input_ids = torch.zeros(n, longest, dtype=torch.long)
    attention = torch.zeros(n, longest, dtype=torch.bool)
    loss_mask = torch.zeros(n, longest, dtype=torch.int32)
    for i, ids in enumerate(seqs):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = True
        loss_mask[i, : len(ids)] = torch.tensor(loss_masks[i])
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "mm_token_type_ids": (input_ids == pad).long(),
        "multi_modal_input": mms,
        "screens": len(pixels),
    }


def model_flops(model_config: Any, batch: dict[str, Any], vision_images: int) -> float:
    """Forward + backward FLOPs: 6 per parameter per token (language model, head, vision
    tower) plus causal attention per row and full attention per encoded image."""
    text, vision = model_config.text_config, model_config.vision_config
    h, layers = text.hidden_size, text.num_hidden_layers
    attn = text.num_attention_heads * text.head_dim
    kv = text.num_key_value_heads * text.head_dim
    per_layer = h * (attn + 2 * kv) + attn * h + 3 * h * text.intermediate_size
    lengths = batch["attention_mask"].sum(-1).tolist()
    tokens = sum(lengths)
    lm = 6 * (layers * per_layer + h * text.vocab_size) * tokens
    lm += sum(6 * layers * t * t * attn for t in lengths)  # causal: half of 12 T^2 d
    grid = batch["multi_modal_input"][0]["image_grid_thw"][0].tolist()
    patches = grid[0] * grid[1] * grid[2]
    vh = vision.hidden_size
    v_layer = 4 * vh * vh + 2 * vh * vision.intermediate_size
    vision_flops = 6 * vision.depth * v_layer * patches + 12 * vision.depth * patches**2 * vh
    return float(lm + vision_images * vision_flops)


def make_actor(
    mode: str, model_dir: Path, dtype: str, checkpointing: bool, max_tokens: int | None
) -> Any:
    from areal.api.cli_args import MicroBatchSpec, OptimizerConfig, PPOActorConfig
    from areal.api.io_struct import FinetuneSpec

    from cua_native.training.cluster.fsdp_actor import CUAFSDPPPOActor

    class Actor(CUAFSDPPPOActor):
        pack_rows = mode != "today"
        vision_once = mode == "packed_vision_once"

    config = PPOActorConfig(
        experiment_name="train-step-pack",
        trial_name=mode,
        path=str(model_dir),
        backend="fsdp:d1",
        attn_impl="sdpa",
        dtype=dtype,
        gradient_checkpointing=checkpointing,
        optimizer=OptimizerConfig(lr=1e-6),
        mb_spec=MicroBatchSpec(max_tokens_per_mb=max_tokens),
    )
    actor = Actor(config=config)
    actor.create_process_group()
    actor.initialize(None, FinetuneSpec(total_train_epochs=1, dataset_size=8, train_batch_size=8))
    return actor


def _visual(model: Any) -> Any:
    inner = model.model if hasattr(model.model, "visual") else model
    return inner.visual


def _loss(logprobs: Any, entropy: Any, data: dict[str, Any], **_: Any) -> Any:
    mask = data["loss_mask"].bool()
    return -(logprobs[mask]).float().sum() / mask.sum().clamp(min=1)


def _weight(data: dict[str, Any]) -> Any:
    return data["loss_mask"].sum()


def run_mode(
    mode: str, args: argparse.Namespace, model_dir: Path, batch: dict[str, Any], device: str
) -> tuple[dict[str, Any], Any]:
    import torch

    cuda = device == "cuda"
    actor = make_actor(
        mode, model_dir, args.dtype, args.checkpointing, args.max_tokens_per_mb or None
    )
    inputs = {k: v for k, v in batch.items() if k != "screens"}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    encoded: list[int] = []
    visual = _visual(actor.model)

    def count(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        grid = kwargs.get("grid_thw")
        encoded.append(int((grid if grid is not None else args[1]).shape[0]))

    hook = visual.register_forward_pre_hook(count, with_kwargs=True)
    try:
        actor.train()
        logp = actor.forward_batch(dict(inputs))  # on the initial weights; warms up compiles
        first = actor.train_batch(dict(inputs), _loss, _weight)  # warm-up step
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        sync()
        t0 = time.perf_counter()
        actor.forward_batch(dict(inputs))
        sync()
        recompute_s = time.perf_counter() - t0
        times = []
        for _ in range(args.repeat):
            encoded.clear()
            sync()
            t0 = time.perf_counter()
            actor.train_batch(dict(inputs), _loss, _weight)
            sync()
            times.append(time.perf_counter() - t0)
        step_s = sorted(times)[len(times) // 2]
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        return {
            "train_step_s": step_s,
            "train_step_all_s": times,
            "recompute_logp_s": recompute_s,
            "first_grad_norm": float(first.get("grad_norm", float("nan"))),
            "micro_batches": int(first.get("num_micro_batches", 0)),
            "images_encoded_per_step": sum(encoded),
            "peak_memory_gib": peak,
        }, logp.float().cpu()
    finally:
        hook.remove()
        actor.destroy()
        del actor
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the tiny Qwen3-VL, small screens")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--group", type=int, default=2)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--history", type=int, default=1, help="history screenshots per prompt")
    parser.add_argument("--text", type=int, default=520, help="prompt text tokens per row")
    parser.add_argument("--output", type=int, default=16, help="trained tokens per row")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--vision-depth", type=int, default=24)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument(
        "--max-tokens-per-mb",
        type=int,
        default=9000,
        help="actor.mb_spec.max_tokens_per_mb of the packed ways (0: none, one micro-batch); "
        "9000 holds one rehearsal episode (two rows), 18000 a task's group",
    )
    parser.add_argument("--dtype", default=None, help="bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak")
    args = parser.parse_args()
    if args.tasks < 1 or args.group < 1 or args.turns < 1 or args.history < 0 or args.repeat < 1:
        parser.error("--tasks, --group, --turns, --repeat must be >= 1 and --history >= 0")
    if args.max_tokens_per_mb < 0:
        parser.error("--max-tokens-per-mb must be >= 0 (0: no cap)")
    if args.device == "cpu" and not args.tiny:
        parser.error("--device cpu runs the tiny model only: add --tiny")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: no GPU visible (use --device cpu --tiny)")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))  # run as a file: ``bench.gpu`` and ``cua_native`` importable
    for key, value in (
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", str(_free_port())),
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
    ):
        os.environ.setdefault(key, value)
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from cua_native.rollout.factories import tiny_model_dir

    if args.tiny:
        model_dir = tiny_model_dir(out / "cache")
        grid = TINY_GRID
    else:
        from bench.gpu.gpu_rehearsal import build_model

        model_dir = (
            Path("/tmp/cua_gpu_rehearsal") / f"qwen3-vl-random-{args.layers}-{args.vision_depth}"
        )
        if not (model_dir / "config.json").is_file():
            build_model(model_dir, args.layers, args.vision_depth)
        grid = REAL_GRID
    model_config = AutoConfig.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = episode_rows(args.tasks, args.group, args.turns, args.history)
    batch = build_batch(model_config, tokenizer, rows, grid, args.text, args.output, seed=0)
    lengths = batch["attention_mask"].sum(-1).tolist()
    tokens, loss_tokens = int(sum(lengths)), int(batch["loss_mask"].sum())
    copies = sum(len(w) for _, w in rows)
    print(
        f"{len(rows)} rows, {tokens} tokens ({loss_tokens} carry loss), "
        f"{copies} screenshot copies of {batch['screens']} distinct; device {args.device}",
        flush=True,
    )
    results: dict[str, Any] = {}
    logps: dict[str, Any] = {}
    for mode in args.modes:
        figures, logp = run_mode(mode, args, model_dir, batch, args.device)
        flops = model_flops(model_config, batch, figures["images_encoded_per_step"])
        figures["executed_tflop"] = flops / 1e12
        figures["peak_share"] = flops / figures["train_step_s"] / (args.peak_tflops * 1e12)
        figures["trained_tokens_per_s"] = tokens / figures["train_step_s"]
        figures["loss_tokens_per_s"] = loss_tokens / figures["train_step_s"]
        results[mode] = figures
        logps[mode] = logp
    base = args.modes[0]
    mask = batch["attention_mask"].clone()
    mask[torch.arange(mask.shape[0]), torch.tensor(lengths) - 1] = False  # last: no next token
    trained = batch["loss_mask"].bool()  # positions predicting a trained token
    for mode, figures in results.items():
        diff = (logps[mode] - logps[base]).abs()
        figures["max_abs_dlogp_vs_" + base] = float(diff[mask].max())
        figures["max_abs_dlogp_trained_vs_" + base] = float(diff[trained].max())
        figures["ratio_vs_" + base] = (
            figures["trained_tokens_per_s"] / results[base]["trained_tokens_per_s"]
        )
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(
        f"{'way':<20} {'step s':>8} {'tok/s':>9} {'x':>6} {'% peak':>7} {'recompute s':>11} "
        f"{'peak GiB':>8} {'|dlogp|':>9} {'mbs':>4} {'images':>6}"
    )
    for mode, f in results.items():
        peak = f"{f['peak_memory_gib']:.1f}" if f["peak_memory_gib"] is not None else "-"
        print(
            f"{mode:<20} {f['train_step_s']:>8.3f} {f['trained_tokens_per_s']:>9.0f} "
            f"{f['ratio_vs_' + base]:>6.2f} {f['peak_share']:>7.1%} {f['recompute_logp_s']:>11.3f} "
            f"{peak:>8} {f['max_abs_dlogp_vs_' + base]:>9.2e} {f['micro_batches']:>4} "
            f"{f['images_encoded_per_step']:>6}",
            flush=True,
        )
    result = {
        "device": device_name,
        "peak_tflops": args.peak_tflops,
        "dtype": args.dtype,
        "tiny": args.tiny,
        "rows": len(rows),
        "tokens": tokens,
        "loss_tokens": loss_tokens,
        "screenshot_copies": copies,
        "distinct_screenshots": batch["screens"],
        "grid_thw": list(grid),
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "modes": results,
    }
    (out / "train_step_pack.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {out / 'train_step_pack.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
