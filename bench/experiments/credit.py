"""Per-step credit, side by side: plain GRPO vs each credit switch vs all of them, from the clean
warm start (``cua.warm_start.early_stop_share=0``), paired on the same seeds.

    uv run python bench/experiments/credit.py --seeds 1 2 3 --steps 10 --jobs 3 --out runs/credit
    uv run python bench/experiments/credit.py --summarize-only --out runs/credit   # tables + JSON + PNG again

Each seed's ``plain`` run builds the seed's warm start (in ``OUT/seed-S/.cache``) and the
baseline evaluation; the other variants of the seed start once that warm start exists, reuse it
and skip the baseline (the same model and evaluation set). A run whose directory has a
``train.log`` is not started again (a restarted driver leaves running runs alone). Every run evaluates once, after its
last step, ``cua.eval_episodes_per_task`` episodes of each of the eight tasks on the eight
phones training never uses. Runs are started with one torch thread each (``--jobs`` at once).

Reported per variant (``--json``, ``--png``): the final evaluation's success and its paired
difference from ``plain``'s (95 % bootstrap over (seed, task) pairs; and from the baseline);
the share of flat groups (every advantage 0); training success of the played root episodes
per step; and the environment steps (model turns, branched siblings included) each variant
took to reach plain GRPO's final training success (plain's mean over its last three steps;
a variant reaches it when its three-step moving average does), as a ratio to plain's own.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cua_native.rollout.outcomes import paired_difference, task_interval
from cua_native.training.warmstart.sft import WARM_START_MARKER

CREDIT = "cua.agent.credit"
BRANCH_THRESHOLD = 0.1
"""Nats over the action's first 8 tokens: about the 75th percentile of the clean warm start's
turns (median 0.02; 1.0 fired on 2 % to 5 % of the turns after the first,
``docs/contracts.md#per-step-credit``)."""
VARIANTS: dict[str, list[str]] = {
    "plain": [],
    "branch": [f"{CREDIT}.branch.enabled=true", f"{CREDIT}.branch.threshold={BRANCH_THRESHOLD}"],
    "anchor": [f"{CREDIT}.anchor.enabled=true"],
    "replay_dyn": [f"{CREDIT}.replay.enabled=true", f"{CREDIT}.dynamic_sampling=true"],
    "all": [
        f"{CREDIT}.branch.enabled=true",
        f"{CREDIT}.branch.threshold={BRANCH_THRESHOLD}",
        f"{CREDIT}.anchor.enabled=true",
        f"{CREDIT}.replay.enabled=true",
        f"{CREDIT}.dynamic_sampling=true",
    ],
}
SMOOTH = 3


def run_dir(out: Path, seed: int, variant: str) -> Path:
    return out / f"seed-{seed}" / variant


def argv(out: Path, seed: int, variant: str, steps: int, extra: list[str]) -> list[str]:
    overrides = [
        f"seed={seed}",
        f"cua.warm_start.seed={seed}",
        "cua.warm_start.early_stop_share=0",
        f"total_train_steps={steps}",
        f"cua.eval_every={steps}",
        "cua.eval_episodes_per_task=1",
        *([] if variant == "plain" else ["cua.baseline=false"]),
        *VARIANTS[variant],
        *extra,
    ]
    directory = run_dir(out, seed, variant)
    return [
        sys.executable,
        "-m",
        "cua_native.train",
        "--no-progress",
        "--run-dir",
        str(directory),
        *overrides,
    ]


def warm_ready(out: Path, seed: int) -> bool:
    """The seed's warm start is on disk (``WARM_START_MARKER`` written last)."""
    return any((out / f"seed-{seed}" / ".cache").glob(f"*/{WARM_START_MARKER}"))


def run_all(
    out: Path, seeds: list[int], variants: list[str], steps: int, jobs: int, extra: list[str]
) -> None:
    waiting = [(s, v) for v in variants for s in seeds]
    waiting.sort(key=lambda sv: (sv[1] != "plain", sv[0]))
    running: dict[int, tuple[int, str, subprocess.Popen[bytes], float]] = {}
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    while waiting or running:
        for seed, variant in list(waiting):
            if len(running) >= jobs:
                break
            if variant != "plain" and not warm_ready(out, seed):
                continue
            waiting.remove((seed, variant))
            directory = run_dir(out, seed, variant)
            if (directory / "train.log").is_file():  # done, or running (a restarted driver)
                continue
            directory.mkdir(parents=True, exist_ok=True)
            command = argv(out, seed, variant, steps, extra)
            (directory / "command.txt").write_text(shlex.join(command) + "\n")
            log = (directory / "train.log").open("wb")
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
            running[proc.pid] = (seed, variant, proc, time.perf_counter())
            print(f"started {variant} seed {seed}", flush=True)
        done = [pid for pid, (_, _, p, _) in running.items() if p.poll() is not None]
        for pid in done:
            seed, variant, proc, started = running.pop(pid)
            print(
                f"finished {variant} seed {seed}: exit {proc.returncode}, "
                f"{time.perf_counter() - started:.0f} s",
                flush=True,
            )
        time.sleep(5)


def first_reach(successes: list[float], env_steps: list[int], target: float) -> int | None:
    """Cumulative environment steps at the first step whose ``SMOOTH``-step moving average of
    training success reaches ``target``; ``None`` if none does. A step that played nothing
    (every group rejected) is left out of the averages."""
    total = 0
    played: list[float] = []
    for success, steps in zip(successes, env_steps, strict=True):
        if steps == 0:
            continue
        total += steps
        played.append(success)
        window = played[-SMOOTH:]
        if sum(window) / len(window) >= target - 1e-9:
            return total
    return None


def final_success(train: list[dict[str, Any]]) -> float:
    """Mean training success of the last ``SMOOTH`` steps that played something."""
    played = [s["root_success"] for s in train if s["env_steps"] > 0][-SMOOTH:]
    return sum(played) / len(played) if played else 0.0


def step_rows(log: Path) -> list[dict[str, Any]]:
    """The step table rows a run printed so far (with the credit columns when it has them):
    what an unfinished run (no ``evals.json``) still tells. ``success`` there counts every
    played episode, branched siblings included."""
    rows: list[dict[str, Any]] = []
    for line in log.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) < 13 or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        row: dict[str, Any] = {
            "step": int(parts[0]),
            "episodes": int(parts[1]),
            "success": float(parts[2].rstrip("%")) / 100,
            "uniform_groups": int(parts[7]),
        }
        if len(parts) >= 18 and "/" in parts[16]:
            signal, groups = parts[16].split("/")
            row.update(
                branch_points=int(parts[13]),
                extra_env_steps=int(parts[14]),
                env_steps=int(parts[15]),
                signal_groups=int(signal),
                groups=int(groups),
                replayed_samples=int(parts[17]),
            )
        rows.append(row)
    return rows


def summarize(out: Path, seeds: list[int], variants: list[str]) -> dict[str, Any]:
    runs: dict[tuple[int, str], dict[str, Any]] = {}
    for seed in seeds:
        for variant in variants:
            path = run_dir(out, seed, variant) / "evals.json"
            if path.is_file():
                runs[(seed, variant)] = json.loads(path.read_text())
    result: dict[str, Any] = {"seeds": seeds, "variants": {}, "unfinished": {}}
    for seed in seeds:
        for variant in variants:
            log = run_dir(out, seed, variant) / "train.log"
            if (seed, variant) not in runs and log.is_file():
                result["unfinished"][f"{variant}/seed-{seed}"] = step_rows(log)
    baseline: dict[str, list[bool]] = {}
    plain_final: dict[str, list[bool]] = {}
    targets: dict[int, float] = {}
    plain_reach: dict[int, int | None] = {}
    for seed in seeds:
        plain = runs.get((seed, "plain"))
        if plain is None:
            continue
        for task, values in (plain.get("baseline") or {}).items():
            baseline[f"{seed}:{task}"] = values
        last = max(plain["evals"], key=int)
        for task, values in plain["evals"][last].items():
            plain_final[f"{seed}:{task}"] = values
        train = plain["train"]
        successes = [s["root_success"] for s in train]
        targets[seed] = final_success(train)
        plain_reach[seed] = first_reach(successes, [s["env_steps"] for s in train], targets[seed])
    for variant in variants:
        final: dict[str, list[bool]] = {}
        flat = groups = env = branch = extra = replayed = 0
        ratios: list[float | None] = []
        curves: dict[int, list[dict[str, Any]]] = {}
        for seed in seeds:
            data = runs.get((seed, variant))
            if data is None:
                continue
            last = max(data["evals"], key=int)
            for task, values in data["evals"][last].items():
                final[f"{seed}:{task}"] = values
            train = data["train"]
            curves[seed] = [
                {k: s[k] for k in ("step", "root_success", "env_steps", "uniform_groups", "groups")}
                for s in train
            ]
            flat += sum(s["uniform_groups"] for s in train)
            groups += sum(s["groups"] for s in train)
            env += sum(s["env_steps"] for s in train)
            branch += sum(s["branch_points"] for s in train)
            extra += sum(s["extra_env_steps"] for s in train)
            replayed += sum(s["replayed_samples"] for s in train)
            if seed in targets:
                reach = first_reach(
                    [s["root_success"] for s in train],
                    [s["env_steps"] for s in train],
                    targets[seed],
                )
                own = plain_reach[seed]
                ratios.append(reach / own if reach is not None and own else None)
        if not final:
            continue
        entry: dict[str, Any] = {
            "runs": len(curves),
            "final": _interval(task_interval(final)),
            "flat_share": flat / groups if groups else None,
            "groups": groups,
            "env_steps": env,
            "branch_points": branch,
            "extra_env_steps": extra,
            "replayed_samples": replayed,
            "env_steps_to_plain_final_ratio": ratios,
            "curves": curves,
        }
        if plain_final and variant != "plain":
            entry["vs_plain"] = _interval(paired_difference(plain_final, final))
        if baseline:
            entry["vs_baseline"] = _interval(paired_difference(baseline, final))
        result["variants"][variant] = entry
    if baseline:
        result["baseline"] = _interval(task_interval(baseline))
    result["plain_final_train_success"] = targets
    result["plain_env_steps_to_own_final"] = plain_reach
    return result


def _interval(i: Any) -> dict[str, float]:
    return {"estimate": i.estimate, "low": i.low, "high": i.high}


def print_table(result: dict[str, Any]) -> None:
    base = result.get("baseline")
    if base:
        print(
            f"baseline (clean warm start): {base['estimate']:.0%} "
            f"[{base['low']:.0%}, {base['high']:.0%}]"
        )
    print(
        f"{'variant':<11} {'runs':>4} {'final':>16} {'vs plain':>22} {'vs baseline':>22} "
        f"{'flat':>5} {'env steps':>9} {'branch':>6} {'+env':>5} {'replay':>6}  reach ratio"
    )
    for run, rows in result.get("unfinished", {}).items():
        credit = [r for r in rows if "groups" in r]
        if not credit:
            print(f"{run}: unfinished, {len(rows)} steps")
            continue
        groups = sum(r["groups"] for r in credit)
        print(
            f"{run}: unfinished, {len(rows)} steps; flat {sum(r['uniform_groups'] for r in credit) / groups:.0%}"
            f" of {groups} groups, signal {sum(r['signal_groups'] for r in credit)},"
            f" branch points {sum(r['branch_points'] for r in credit)},"
            f" extra env steps {sum(r['extra_env_steps'] for r in credit)} of"
            f" {sum(r['env_steps'] for r in credit)}, replayed rows"
            f" {sum(r['replayed_samples'] for r in credit)}"
        )
    for name, v in result["variants"].items():
        f = v["final"]
        vp = v.get("vs_plain")
        vb = v.get("vs_baseline")
        fmt = lambda i: f"{i['estimate']:+.1%} [{i['low']:+.1%},{i['high']:+.1%}]" if i else "-"  # noqa: E731
        ratios = " ".join(
            "-" if r is None else f"{r:.2f}" for r in v["env_steps_to_plain_final_ratio"]
        )
        print(
            f"{name:<11} {v['runs']:>4} {f['estimate']:>5.0%} [{f['low']:.0%},{f['high']:.0%}] "
            f"{fmt(vp):>22} {fmt(vb):>22} {v['flat_share'] or 0:>5.0%} {v['env_steps']:>9} "
            f"{v['branch_points']:>6} {v['extra_env_steps']:>5} {v['replayed_samples']:>6}  {ratios}"
        )


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {
        "plain": "#111827",
        "branch": "#dc2626",
        "anchor": "#2563eb",
        "replay_dyn": "#16a34a",
        "all": "#9333ea",
    }
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2))
    names = list(result["variants"])
    for name, v in result["variants"].items():
        for seed, curve in v["curves"].items():
            xs, total = [], 0
            for point in curve:
                total += point["env_steps"]
                xs.append(total)
            ax1.plot(
                xs,
                [p["root_success"] for p in curve],
                color=colors.get(name, "grey"),
                alpha=0.75,
                label=name if str(seed) == str(min(v["curves"])) else None,
            )
    ax1.set_xlabel("environment steps (cumulative)")
    ax1.set_ylabel("training success (root episodes)")
    ax1.set_title("training success per step")
    ax1.legend(fontsize=8)
    finals = [result["variants"][n]["final"] for n in names]
    ax2.bar(
        names,
        [f["estimate"] for f in finals],
        color=[colors.get(n, "grey") for n in names],
        yerr=[
            [f["estimate"] - f["low"] for f in finals],
            [f["high"] - f["estimate"] for f in finals],
        ],
        capsize=4,
    )
    base = result.get("baseline")
    if base:
        ax2.axhline(base["estimate"], color="grey", linestyle="--", label="baseline")
        ax2.legend(fontsize=8)
    ax2.set_ylim(0, 1)
    ax2.set_title("final evaluation (new phones), 95% CI")
    ax3.bar(
        names,
        [result["variants"][n]["flat_share"] or 0 for n in names],
        color=[colors.get(n, "grey") for n in names],
    )
    ax3.set_ylim(0, 1)
    ax3.set_title("share of flat groups (no signal)")
    fig.suptitle(f"per-step credit from the clean warm start, seeds {result['seeds']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (~2-5 GB each)")
    parser.add_argument("--out", type=Path, default=Path("runs/credit"))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument(
        "--json", type=Path, default=Path("bench/experiments/results/per-step-credit/credit.json")
    )
    parser.add_argument(
        "--png", type=Path, default=Path("bench/experiments/results/per-step-credit/credit.png")
    )
    parser.add_argument("--summarize-only", action="store_true")
    parser.add_argument("overrides", nargs="*", help="config overrides for every run")
    args = parser.parse_args()
    if not args.summarize_only:
        run_all(args.out, args.seeds, args.variants, args.steps, args.jobs, args.overrides)
    result = summarize(args.out, args.seeds, args.variants)
    if not result["variants"]:
        print(f"no finished run under {args.out}", file=sys.stderr)
        return 1
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    plot(result, args.png)
    print_table(result)
    print(f"wrote {args.json} and {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
