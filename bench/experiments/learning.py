"""Does the embedded default learn, for every seed? Runs ``python -m cua_native.train`` once per
seed (each from an empty model cache, in a run directory of its own) and prints each run's
evaluation curve, its gain over the baseline with the paired 95 % interval, wall and CPU time.

    uv run python bench/experiments/learning.py                       # seeds 1 2 3, one after another
    uv run python bench/experiments/learning.py --jobs 3 --cores-per-job 2   # in parallel, 2 cores each
    uv run python bench/experiments/learning.py --seeds 1 --variant "lr1e-3:actor.optimizer.lr=1e-3"

``--variant NAME[@SEED/SEED]:KEY=VALUE,...`` (repeatable) runs the seeds (or its own) again
with config overrides, for ablations (a value may be a list: ``cua.tasks.task_ids=[sim-001,
sim-002]``); ``--jobs`` runs several at once, each pinned to its own ``--cores-per-job`` cores
(``taskset``) with torch's threads set to match, so each run sees the 2-core target machine;
the cores come from those this process may use (under ``taskset -c 8-15``, from 8-15).
Overrides for every run go before ``--seeds`` (which takes every integer after it).
Exits non-zero when a run fails or any run's gain is under ``--min-gain`` or its interval
includes 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Job:
    variant: str
    seed: int
    overrides: list[str]
    run_dir: Path
    cores: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    returncode: int | None = None


def _top_level_split(text: str) -> list[str]:
    """Split at the commas outside brackets: ``a=1,b=[x,y]`` → ``a=1``, ``b=[x,y]``."""
    parts: list[str] = []
    depth = start = 0
    for i, char in enumerate(text):
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def parse_variant(text: str) -> tuple[str, list[int] | None, list[str]]:
    """``NAME[@SEED/SEED...]:KEY=VALUE,...`` → name, its own seeds (or None), overrides."""
    head, _, rest = text.partition(":")
    name, _, seeds = head.partition("@")
    overrides = [o.strip() for o in _top_level_split(rest) if o.strip()]
    if not name or any("=" not in o for o in overrides):
        raise SystemExit(f"--variant {text!r}: expected NAME[@S/S]:KEY=VALUE,KEY=VALUE")
    try:
        own = [int(x) for x in seeds.split("/")] if seeds else None
    except ValueError:
        raise SystemExit(f"--variant {text!r}: seeds must be integers") from None
    return name, own, overrides


def command(job: Job, launcher: list[str], extra: list[str]) -> list[str]:
    argv = [
        *launcher,
        "--no-progress",
        "--run-dir",
        str(job.run_dir / "run"),
        f"seed={job.seed}",
        f"cua.warm_start.seed={job.seed}",
        *extra,
        *job.overrides,
    ]
    if job.cores:
        argv = ["taskset", "-c", ",".join(map(str, job.cores)), *argv]
    return argv


def start(job: Job, launcher: list[str], extra: list[str]) -> subprocess.Popen[bytes]:
    job.run_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if job.cores:
        threads = str(len(job.cores))
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    log = (job.run_dir / "train.log").open("wb")
    argv = command(job, launcher, extra)
    (job.run_dir / "command.txt").write_text(shlex.join(argv) + "\n")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)


def run_all(
    jobs: list[Job], parallel: int, cores: int, launcher: list[str], extra: list[str]
) -> None:
    """Run ``jobs``, ``parallel`` at a time; record each one's wall and CPU seconds."""
    allowed = sorted(os.sched_getaffinity(0))
    free = [allowed[i * cores : (i + 1) * cores] for i in range(parallel)] if cores else []
    waiting = list(jobs)
    running: dict[int, tuple[Job, subprocess.Popen[bytes], float, list[int]]] = {}
    while waiting or running:
        while waiting and len(running) < parallel:
            job = waiting.pop(0)
            slot = free.pop(0) if free else []
            job.cores = slot
            started = time.perf_counter()
            proc = start(job, launcher, extra)
            running[proc.pid] = (job, proc, started, slot)
            print(f"started {job.variant} seed {job.seed} on cores {slot or 'all'}", flush=True)
        pid, status, usage = os.wait4(-1, 0)
        if pid not in running:
            continue
        job, proc, started, slot = running.pop(pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
        job.returncode = proc.returncode
        job.wall_s = time.perf_counter() - started
        job.cpu_s = usage.ru_utime + usage.ru_stime
        if slot:
            free.append(slot)
        print(
            f"finished {job.variant} seed {job.seed}: exit {job.returncode}, "
            f"{job.wall_s:.0f} s wall, {job.cpu_s:.0f} s CPU",
            flush=True,
        )


def load_evals(job: Job) -> dict[str, Any] | None:
    path = job.run_dir / "run" / "evals.json"
    return json.loads(path.read_text()) if path.is_file() else None


def curve(evals: dict[str, Any]) -> str:
    parts = []
    for point in evals["points"]:
        name = "base" if point["step"] < 0 else f"s{point['step']}"
        errors = point.get("parse_errors_per_turn")
        bad = f" pe{errors:.0%}" if errors is not None else ""
        parts.append(f"{name} {point['rate']:.0%} [{point['low']:.0%},{point['high']:.0%}]{bad}")
    return "  ".join(parts)


def summarize(jobs: list[Job], min_gain: float) -> bool:
    ok = True
    print()
    print(
        f"{'variant':<18} {'seed':>4} {'base':>5} {'final':>5} {'gain':>6} {'95% CI':>16} "
        f"{'wall s':>7} {'CPU s':>7}  curve (success rate [95% CI over tasks])"
    )
    by_variant: dict[str, list[float]] = {}
    for job in jobs:
        evals = load_evals(job) if job.returncode == 0 else None
        gain = evals.get("gain") if evals else None
        if gain is None:
            ok = False
            why = (
                f"failed (exit {job.returncode})"
                if job.returncode != 0
                else "no gain: the run made no evaluation after its baseline (cua.eval_every=0?)"
            )
            print(f"{job.variant:<18} {job.seed:>4}  {why}; see {job.run_dir / 'train.log'}")
            continue
        good = gain["difference"] >= min_gain and gain["low"] > 0
        ok = ok and good
        by_variant.setdefault(job.variant, []).append(gain["difference"])
        ci = f"[{gain['low']:+.0%}, {gain['high']:+.0%}]"
        print(
            f"{job.variant:<18} {job.seed:>4} {gain['baseline']:>5.0%} {gain['final']:>5.0%} "
            f"{gain['difference']:>+6.0%} {ci:>16} {job.wall_s:>7.0f} {job.cpu_s:>7.0f}  "
            f"{curve(evals)}{'' if good else '  <-- below target'}"
        )
    print()
    for variant, gains in by_variant.items():
        mean = sum(gains) / len(gains)
        print(
            f"{variant:<18} mean gain {mean:+.1%} over {len(gains)} seed(s), min {min(gains):+.1%}"
        )
    print(
        f"target: gain >= {min_gain:.0%} with the interval excluding 0 for every run: "
        f"{'met' if ok else 'NOT met'}"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, default=Path("runs/learning"))
    parser.add_argument("--jobs", type=int, default=1, help="runs at once")
    parser.add_argument(
        "--cores-per-job", type=int, default=0, help="pin each run to this many cores (taskset)"
    )
    parser.add_argument("--variant", action="append", default=[], help="NAME:KEY=VALUE,...")
    parser.add_argument("--no-default", action="store_true", help="only the --variant runs")
    parser.add_argument("--min-gain", type=float, default=0.15)
    parser.add_argument(
        "--launcher",
        default=f"{shlex.quote(sys.executable)} -m cua_native.train",
        help="how to start the trainer (a command line)",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides for every run")
    args = parser.parse_args()
    if args.jobs < 1 or args.cores_per_job < 0:
        parser.error("--jobs must be >= 1 and --cores-per-job >= 0")
    if args.cores_per_job and args.jobs * args.cores_per_job > len(os.sched_getaffinity(0)):
        parser.error("--jobs x --cores-per-job is more cores than this process may use")
    variants: list[tuple[str, list[int] | None, list[str]]] = (
        [] if args.no_default else [("default", None, [])]
    )
    variants += [parse_variant(v) for v in args.variant]
    if not variants:
        parser.error("nothing to run")
    jobs = [
        Job(name, seed, overrides, args.out / name / f"seed-{seed}")
        for name, seeds, overrides in variants
        for seed in seeds or args.seeds
    ]
    run_all(jobs, args.jobs, args.cores_per_job, shlex.split(args.launcher), args.overrides)
    return 0 if summarize(jobs, args.min_gain) else 1


if __name__ == "__main__":
    sys.exit(main())
