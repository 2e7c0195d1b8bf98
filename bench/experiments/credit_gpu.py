"""Per-step credit on the GPU bench: plain GRPO vs credit switches on ``learning_gpu``'s shape
(43.5 M Qwen3-VL, 26 training tasks x 4 episodes a step), from its clean warm start
(``--early-stop-share 0 --early-stop-after 0``), paired on the same seeds.

    uv run python bench/experiments/credit_gpu.py --out runs/credit-gpu --seeds 1 2 3
    uv run python bench/experiments/credit_gpu.py --out runs/credit-gpu --summarize-only

Per seed, one warm start (``learning_gpu --warm-only``, ``OUT/warm-S``) that every variant of
the seed then reuses (``--warm-from``): the variants differ only in their credit switches. All
seeds' warm starts run at once, then all (seed, variant) runs at once, sharing one GPU
(``--warm-threads`` / ``--run-threads`` torch threads each).

Reported (``OUT/credit_gpu.json``): per variant the baseline and final training-task success
(each run evaluates on the phone no training step uses), its paired difference from ``plain``'s
final evaluation and from its own baseline (95 % bootstrap over (seed, task) pairs), the share
of flat groups (every episode of the group the same reward) over the played steps, the
environment steps played (model turns, branched siblings included), branch points and replayed
samples, read from each run's step table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from cua_native.rollout.outcomes import paired_difference, task_interval

CREDIT = "cua.agent.credit"
VARIANTS: dict[str, list[str]] = {
    "plain": [],
    "branch": [f"{CREDIT}.branch.enabled=true", f"{CREDIT}.branch.threshold=0.1"],
    "branch_schedule": [
        f"{CREDIT}.branch.enabled=true",
        f"{CREDIT}.branch.trigger=schedule",
        f"{CREDIT}.branch.turns=[0,1,2]",
        f"{CREDIT}.branch.max_points=3",
    ],
    "all": [
        f"{CREDIT}.branch.enabled=true",
        f"{CREDIT}.branch.threshold=0.1",
        f"{CREDIT}.anchor.enabled=true",
        f"{CREDIT}.replay.enabled=true",
    ],
}
"""``all``: branching, anchor groups and success replay. The bench already skips flat groups
(``cua.skip_uniform_groups``); dynamic resampling is left out: with most of 26 groups flat it
would play up to ``dynamic_rounds`` more rounds a step."""
CLEAN = ["--early-stop-share", "0", "--early-stop-after", "0"]
ROW = re.compile(r"^\s+\d+\s+\d+\s+\d+%")


def bench_command(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).with_name("learning_gpu.py")), *args]


def run_all(args: argparse.Namespace) -> None:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    steps = ["--steps", str(args.steps), "--eval-every", str(args.eval_every), *CLEAN]

    def start(name: str, threads: int, command: list[str]) -> subprocess.Popen[bytes]:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        log = (out / f"{name}.log").open("wb")
        print(f"started {name}", flush=True)
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    warm = {
        s: start(
            f"warm-{s}",
            args.warm_threads,
            bench_command("--out", str(out / f"warm-{s}"), "--seed", str(s), *steps, "--warm-only"),
        )
        for s in args.seeds
        if not (out / f"warm-{s}" / "warm" / "bench_made_with.json").is_file()
    }
    for s, proc in warm.items():
        if proc.wait() != 0:
            sys.exit(f"the warm start of seed {s} failed: {out / f'warm-{s}.log'}")
    runs = [
        start(
            f"{variant}-{s}",
            args.run_threads,
            bench_command(
                "--out",
                str(out / f"{variant}-{s}"),
                "--seed",
                str(s),
                *steps,
                "--warm-from",
                str(out / f"warm-{s}" / "warm"),
                *VARIANTS[variant],
            ),
        )
        for s in args.seeds
        for variant in args.variants
        if not (out / f"{variant}-{s}" / "gpu_learning.json").is_file()
    ]
    failed = [p.args for p in runs if p.wait() != 0]
    if failed:
        print(f"{len(failed)} runs failed; their logs are under {out}", flush=True)


def step_rows(log: Path) -> list[dict[str, Any]]:
    """The step table's rows by column name (the header line names them)."""
    header: list[str] = []
    rows: list[dict[str, Any]] = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("step episodes"):
            header = line.replace("logp Δ", "logp_delta").split()
        elif header and ROW.match(line):
            rows.append(dict(zip(header, line.split(), strict=False)))
    return rows


def flat_and_steps(rows: list[dict[str, Any]], groups: int) -> dict[str, Any]:
    """Flat share (from ``signal`` = groups with signal / played where the credit columns are
    shown, else ``uniform`` of ``groups``), environment steps, branch points, replays."""
    flat = played = env = branch = replayed = 0
    for r in rows:
        if "signal" in r:
            with_signal, of = (int(x) for x in r["signal"].split("/"))
            flat, played = flat + of - with_signal, played + of
            env += int(r["env"])
            branch += int(r["branch"])
            replayed += int(r["replay"])
        else:
            flat, played = flat + int(r["uniform"]), played + groups
            env += round(float(r["turns"]) * int(r["episodes"]))
    return {
        "flat_share": flat / played if played else 0.0,
        "env_steps": env,
        "branch_points": branch,
        "replayed": replayed,
    }


def summarize(out: Path, seeds: list[int], variants: list[str]) -> dict[str, Any]:
    from bench.experiments.learning_gpu import split_ids

    train_ids, _ = split_ids()

    def outcomes(variant: str, which: str) -> dict[str, list[int]]:
        pooled: dict[str, list[int]] = {}
        for s in seeds:
            evals = json.loads((out / f"{variant}-{s}" / "run" / "evals.json").read_text())
            part = (
                evals["baseline"]
                if which == "baseline"
                else evals["evals"][max(evals["evals"], key=int)]
            )
            for task, values in part.items():
                if task in train_ids:
                    pooled[f"{s}/{task}"] = [int(bool(v)) for v in values]
        return pooled

    def interval(i: Any) -> dict[str, float]:
        return {"estimate": i.estimate, "low": i.low, "high": i.high}

    result: dict[str, Any] = {"seeds": seeds, "variants": {}}
    plain_final = outcomes("plain", "final")
    for variant in variants:
        base, final = outcomes(variant, "baseline"), outcomes(variant, "final")
        rows = [r for s in seeds for r in step_rows(out / f"{variant}-{s}.log")]
        entry = {
            "baseline": interval(task_interval(base)),
            "final": interval(task_interval(final)),
            "vs_baseline": interval(paired_difference(base, final)),
            **flat_and_steps(rows, len(train_ids)),
        }
        if variant != "plain":
            entry["vs_plain"] = interval(paired_difference(plain_final, final))
        result["variants"][variant] = entry
    return result


def print_table(result: dict[str, Any]) -> None:
    def pct(i: dict[str, float], sign: str = "") -> str:
        return f"{i['estimate']:{sign}.1%} [{i['low']:{sign}.1%}, {i['high']:{sign}.1%}]"

    print(
        f"{'variant':<16}{'baseline':>22}{'final':>22}{'vs baseline':>26}{'vs plain':>26}"
        f"{'flat':>6}{'env':>8}{'branch':>7}{'replay':>7}"
    )
    for name, v in result["variants"].items():
        vs_plain = pct(v["vs_plain"], "+") if "vs_plain" in v else "-"
        print(
            f"{name:<16}{pct(v['baseline']):>22}{pct(v['final']):>22}"
            f"{pct(v['vs_baseline'], '+'):>26}{vs_plain:>26}{v['flat_share']:>6.0%}"
            f"{v['env_steps']:>8}{v['branch_points']:>7}{v['replayed']:>7}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/credit-gpu"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--variants", nargs="+", default=["plain", "all"], choices=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=8)
    parser.add_argument("--warm-threads", type=int, default=5)
    parser.add_argument("--run-threads", type=int, default=2)
    parser.add_argument("--summarize-only", action="store_true")
    args = parser.parse_args()
    if "plain" not in args.variants:
        parser.error("the variants are compared with plain: include it")
    if not args.summarize_only:
        run_all(args)
    result = summarize(args.out, args.seeds, args.variants)
    (args.out / "credit_gpu.json").write_text(json.dumps(result, indent=2))
    print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
