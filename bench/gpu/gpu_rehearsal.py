"""GPU rehearsal of a cluster config: AReaL's PPOTrainer with a 2B-sized random Qwen3-VL at
Qwen3-VL's real pixel budget (issue 12).

Builds the model as ``bench/gpu/gpu_check.py`` does (text 2048 x 28 layers, vision 1024 x 24,
vocab 151936, bf16, random weights; the tiny model's tokenizer) with the processor budget of
Qwen3-VL (a 1080x2400 screenshot stays 1088x2400: 2,550 image tokens), saves it, then runs

    python -m cua_native.train --config CONFIG --rehearse --device cuda --model DIR --steps N

With two GPUs the stand-in server runs on the second and the FSDP actor on the first, and the
config's ``xccl`` weight update is kept; with one both share it and the update goes through
disk (said aloud by the rehearsal). Prints per step the time split AReaL measured (rollout,
train step, weight update, ...), peak GPU memory per device (``nvidia-smi`` sampled each second),
and tokens/s; writes it all to ``OUT/gpu_rehearsal.json``.

    python bench/gpu/gpu_rehearsal.py --out OUT [--config configs/qwen3_vl_android.yaml]
        [--steps 3] [--layers 28] [--vision-depth 24] [key=value ...]

Generation figures are the stand-in server's (the in-process transformers engine), not
SGLang's: what this proves is the trainer side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REAL_BUDGET = {"shortest_edge": 65536, "longest_edge": 16777216}
"""Qwen3-VL's image processor ``size`` (pixels)."""
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "processor_config.json",
    "preprocessor_config.json",
    "special_tokens_map.json",
    "video_preprocessor_config.json",
)


def build_model(target: Path, layers: int, vision_depth: int) -> None:
    import torch

    from bench.gpu.gpu_check import real_size_model
    from cua_native.rollout.factories import tiny_model_dir

    tiny = tiny_model_dir(target.parent / "cache")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny))
    args = argparse.Namespace(real_layers=layers, real_vision_depth=vision_depth)
    model = real_size_model(tokenizer, torch.device("cuda"), args)
    model.save_pretrained(str(target))
    del model
    torch.cuda.empty_cache()
    for name in TOKENIZER_FILES:
        if (tiny / name).is_file():
            shutil.copy(tiny / name, target / name)
    for name in ("processor_config.json", "preprocessor_config.json"):
        path = target / name
        if path.is_file():
            config = json.loads(path.read_text())
            section = config.get("image_processor", config)
            section["size"] = dict(REAL_BUDGET)
            path.write_text(json.dumps(config, indent=2))


def sample_memory(stop: threading.Event, peaks: dict[str, int]) -> None:
    while not stop.wait(1.0):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        for line in out.strip().splitlines():
            index, used = (x.strip() for x in line.split(","))
            peaks[index] = max(peaks.get(index, 0), int(used))


def step_figures(db: Path) -> list[dict[str, float]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select step, metrics_json from step order by step").fetchall()
    figures = []
    for step, metrics in rows:
        stats = json.loads(metrics or "{}")
        keep = {k: v for k, v in stats.items() if k.startswith("timeperf/")}
        for key in (
            "ppo_actor/n_tokens",
            "ppo_actor/update/n_valid_tokens",
            "ppo_actor/n_seqs",
            "ppo_actor/update/actor_loss/avg",
            "ppo_actor/update/grad_norm",
        ):
            if key in stats:
                keep[key] = stats[key]
        rollout = stats.get("timeperf/rollout")
        generated = stats.get("ppo_actor/update/n_valid_tokens")
        if rollout and generated:
            keep["generated_tokens_per_s"] = generated / rollout
        train = stats.get("timeperf/train_step")
        if train and stats.get("ppo_actor/n_tokens"):
            keep["trained_tokens_per_s"] = stats["ppo_actor/n_tokens"] / train
        figures.append({"step": step, **keep})
    return figures


def rpc_summary(folder: Path) -> list[dict[str, object]]:
    """Per actor call the controller made (``compute_logp``, ``ppo_update``, ...): its round
    trip as the controller saw it, and the seconds the worker spent inside it per timed
    function (the actor method, the engine's model work, AReaL's tensor transport)."""
    records = [
        json.loads(line) | {"pid": path.stem}
        for path in sorted(folder.glob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    calls = sorted(
        (r for r in records if r["label"] == "TrainController._custom_function_call"),
        key=lambda r: r["start"],
    )
    rows: list[dict[str, object]] = []
    for call in calls:
        lo, hi = call["start"], call["start"] + call["dur"]
        inside: dict[str, float] = {}
        for r in records:
            if r is not call and r["label"] != call["label"] and lo <= r["start"] <= hi:
                side = "controller" if r["pid"] == call["pid"] else "worker"
                key = f"{side}:{r['label']}"
                inside[key] = inside.get(key, 0.0) + r["dur"]
        rows.append(
            {"method": call["method"], "round_trip_s": round(call["dur"], 3)}
            | {k: round(v, 3) for k, v in sorted(inside.items())}
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", default="configs/qwen3_vl_android.yaml")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--vision-depth", type=int, default=24)
    parser.add_argument("--timeout", type=float, default=480)
    parser.add_argument(
        "--rpc-timing",
        action="store_true",
        help="time each actor call: the controller's round trip, the worker's model work and "
        "AReaL's tensor transport (gpu_site/sitecustomize.py), summarised per call",
    )
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/cua_gpu_rehearsal")
    model_dir = work / "qwen3-vl-2b-random"
    started = time.monotonic()
    if not (model_dir / "config.json").is_file():
        build_model(model_dir, args.layers, args.vision_depth)
    built = time.monotonic() - started
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE / "gpu_site"), str(ROOT), env.get("PYTHONPATH", "")]
    )
    run_dir = out / "run"
    timing_dir = out / "rpc_timing"
    if args.rpc_timing:
        shutil.rmtree(timing_dir, ignore_errors=True)
        timing_dir.mkdir()
        env["CUA_RPC_TIMING_DIR"] = str(timing_dir)
    cmd = [
        sys.executable,
        "-m",
        "cua_native.train",
        "--config",
        args.config,
        "--rehearse",
        "--device",
        "cuda",
        "--model",
        str(model_dir),
        "--steps",
        str(args.steps),
        "--run-dir",
        str(run_dir),
        "--dtype",
        "bfloat16",
        *args.overrides,
    ]
    print("$", " ".join(cmd), flush=True)
    peaks: dict[str, int] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample_memory, args=(stop, peaks), daemon=True)
    sampler.start()
    t0 = time.monotonic()
    with (out / "rehearsal.log").open("w") as log:
        try:
            rc = subprocess.run(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout, cwd=ROOT
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.monotonic() - t0
    stop.set()
    result = {
        "returncode": rc,
        "model_build_s": round(built, 1),
        "rehearsal_wall_s": round(wall, 1),
        "peak_gpu_memory_mib": peaks,
        "steps": [],
    }
    db = run_dir / "monitor.db"
    if db.is_file():
        result["steps"] = step_figures(db)
    if args.rpc_timing:
        result["actor_calls"] = rpc_summary(timing_dir)
    (out / "gpu_rehearsal.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    # every log flat at the top of OUT (the device brings back only shallow folders): the
    # stand-in server's and the gym's, and AReaL's per-role logs
    for log in sorted((run_dir / "logs").glob("*.log")):
        shutil.copy(log, out / f"run-{log.name}")
    for log in sorted((run_dir / "areal" / "logs").rglob("*.log")):
        shutil.copy(log, out / f"areal-{log.name}")
    if rc != 0:
        print((out / "rehearsal.log").read_text()[-8000:])
    return rc


if __name__ == "__main__":
    sys.exit(main())
