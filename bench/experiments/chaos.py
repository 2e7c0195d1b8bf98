"""Chaos that must not bias learning: whole embedded-default training runs with environment and
inference faults at 0 %, 5 % and 20 % of calls, 3 seeds, paired with the fault-free run.

    uv run python bench/experiments/chaos.py                      # 3 seeds x 3 levels, the short run
    uv run python bench/experiments/chaos.py --jobs 9 --threads 1 # all 9 runs at once (16 cores)
    uv run python bench/experiments/chaos.py --steps 24 --eval-episodes 2   # the default's length
    uv run python bench/experiments/chaos.py --analyse bench/experiments/results/chaos-bench

Each run trains the embedded default (tiny Qwen3-VL, its warm start, AReaL's PPOActor) against
the simulator served over HTTP by ``cua_native.gym.server`` with a fault profile
(``cua_native.gym.faults``), and against the in-process engine wrapped in seeded inference
faults (``cua_native.engine.faults``). At level ``p`` every environment call meets one of
five faults with probability ``p`` (``p/5`` each): a crash (the execution dies: 502, then 404),
a hang (the request stalls past the client's timeout, then runs), a 429 with ``Retry-After``, a
503, a connection dropped after the route ran (an action acted, its answer lost); creates also
hang ``--slow-create-s`` on ``p/5`` of them (slow resets).
Each model call stalls ``--engine-stall-s`` on ``p/2`` of calls and fails as an inference
server restart on ``p/2``.

``--short`` (the default, CPU is scarce): ``--steps 8`` GRPO steps instead of the default's 24,
no baseline evaluation, one final evaluation of all 128 evaluation episodes (8 tasks x 8 phones
x 2). Every (seed, level) starts from the seed's same warm start (built once, cached).

Faults are recovered at the call (``cua.agent.recovery``,
``docs/contracts.md#recovery-at-the-call``): the gym client retries reads, idempotent actions
and 429s; a crashed execution is restored by exact replay on a fresh one; a model call that
failed before answering is sent again. Only what cannot be recovered rejects its episode.

Checked and printed per run: final-evaluation success, and per level the paired difference
against the fault-free run of the same seed (bootstrap over seed x task, 95 %); that no
trained episode ended on an execution a fault damaged (the gym server's own fault log: a crash;
an action fault too when the server does not honour idempotency keys) and that every crashed
execution of a trained episode is one it restored by replay; that the gym server holds no
execution and no process of the run is left; the step table (rollout share, rejected
episodes, dropped groups, retries, recovered calls, time lost waiting) and the monitor's step
metrics with the same figures. ``--jobs N`` runs N (seed, level) runs at once, after each
seed's warm start is built once. Results: ``--out`` (JSON per run, ``summary.json``,
``chaos.png``). Exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

LEVELS = (0.0, 0.05, 0.2)
SEEDS = (1, 2, 3)
FAULT_KINDS = ("crash", "stall", "throttle", "error", "drop")
DAMAGING = {"crash"}
"""Faults that damage an execution on any route (it is gone)."""
ACTION_DAMAGING = {"drop", "drop_after", "error", "stall"}
"""Faults that damage an execution when they hit an action of a server that does not honour
idempotency keys (the action is then never retried: it may have run). Ours does: a retried
action runs once, so they damage nothing there (its capabilities say ``idempotent_actions``)."""
GYM_TIMEOUTS = {"connect": 5.0, "read": 4.0, "act": 4.0, "evaluate": 4.0, "terminate": 4.0}
FAULT_LINE = re.compile(r"fault=(\w+) route=(\w+) path=(\S+)")


def fault_profile(level: float, seed: int, stall_s: float, slow_create_s: float) -> dict[str, Any]:
    share = level / len(FAULT_KINDS)
    table = {"*": share}
    return {
        "seed": seed,
        "crash_share": table,
        "stall_share": table,
        "stall_s": stall_s,
        "throttle_share": table,
        "retry_after_s": 1,
        "error_share": table,
        "drop_after_share": table,
        "create_hang": {"seconds": slow_create_s, "share": share},
    }


def engine_faults(level: float, seed: int, stall_s: float) -> dict[str, Any]:
    return {
        "seed": seed,
        "stall_share": level / 2,
        "stall_s": stall_s,
        "restart_share": level / 2,
    }


def level_name(level: float) -> str:
    return f"L{round(level * 100):02d}"


# --------------------------------------------------------------------------- one run (child)
def run_one(args: argparse.Namespace) -> int:
    """One training run in this process: the warm start (cached per seed) on the embedded
    simulator, then training against the faulty gym server at ``--gym-url``."""
    import dataclasses

    import torch._dynamo

    from cua_native.config import load_config
    from cua_native.engine.faults import EngineFaults, FaultyEngine
    from cua_native.rollout.runtime import tune_for_rollouts, with_cpu_pool
    from cua_native.training.embedded.model import prepare_model
    from cua_native.training.embedded.report import print_report
    from cua_native.training.embedded.trainer import EmbeddedTrainer

    torch._dynamo.config.disable = True
    torch.set_num_threads(args.threads)
    run_dir = Path(args.run_dir)
    common = [
        f"seed={args.seed}",
        f"cua.warm_start.seed={args.seed}",
        f"total_train_steps={args.steps}",
        f"cua.eval_every={args.steps}",
        f"cua.eval_episodes_per_task={args.eval_episodes}",
        f"cua.baseline={str(args.baseline).lower()}",
        f"cua.run_dir={run_dir}",
    ]
    # the seed's warm start, built once in the seed's directory and reused by every level
    warm = load_config(None, [*common, f"cua.run_dir={run_dir.parent.parent / 'warm'}"])
    model_dir = prepare_model(warm, progress=False).path
    if args.warm_only:
        return 0
    options = json.dumps({"timeouts": GYM_TIMEOUTS}).replace('"', "")
    loaded = load_config(
        None,
        [
            *common,
            f"cua.agent.model_path={model_dir}",
            f"cua.agent.gym.options={options}",
        ],
        gym_url=args.gym_url,
    )
    wrapped: list[FaultyEngine] = []  # the wrapper, for its counts

    def wrap(engine: Any) -> Any:
        faulty = FaultyEngine(engine, EngineFaults.model_validate(json.loads(args.engine_faults)))
        wrapped.append(faulty)
        return faulty

    ledger = Ledger(infra_retries=loaded.cua.agent.infra_retries)
    tune_for_rollouts()
    trainer = EmbeddedTrainer(loaded, progress=False, engine_wrapper=wrap, observers=[ledger])
    report = asyncio.run(with_cpu_pool(trainer.run()))
    print_report(report, step_table=False)
    after = report.after_steps
    final = max(after) if after else None
    result = {
        "seed": args.seed,
        "level": args.level,
        "model_dir": str(model_dir),
        "steps": [
            {**dataclasses.asdict(s), "rollout_share": s.rollout_share} for s in report.steps
        ],
        "final_eval_step": final,
        "final_outcomes": after[final].outcomes if final is not None else {},
        "evals": {step: r.success_rate for step, r in after.items()},
        "engine_faults": dataclasses.asdict(wrapped[0].counts) if wrapped else {},
        "trained_executions": sorted(ledger.trained()),
        "restored_executions": sorted(ledger.restored()),
        "rejected_executions": sorted(ledger.rejected),
        "monitor_db": str(run_dir / "monitor.db"),
    }
    Path(args.result).write_text(json.dumps(result, indent=1))
    return 0


class Ledger:
    """Episode observer: which executions' episodes ended up in a trained (kept) group.

    A group is dropped when an episode of it is rejected on its last allowed attempt
    (``infra_retries``); every other group's completed episodes are its training rows."""

    def __init__(self, infra_retries: int) -> None:
        self.infra_retries = infra_retries
        self.completed: dict[str, set[str]] = {}
        self.lost: dict[str, set[str]] = {}
        """Group → executions its completed episodes lost and restored by replay."""
        self.dropped: set[str] = set()
        self.rejected: set[str] = set()

    def episode_started(self, context: Any) -> None:
        return None

    def turn_finished(self, context: Any, turn: Any) -> None:
        return None

    def episode_finished(self, record: Any) -> None:
        context = record.context
        if context.source != "step":
            return
        if record.outcome == "rejected":
            if context.execution_id:
                self.rejected.add(context.execution_id)
            if context.attempt >= self.infra_retries:
                self.dropped.add(context.group_id)
            return
        if context.execution_id:  # the execution the episode ended on
            self.completed.setdefault(context.group_id, set()).add(context.execution_id)
        self.lost.setdefault(context.group_id, set()).update(record.lost_executions)

    def trained(self) -> set[str]:
        """Executions trained episodes ended on."""
        return {e for g, ids in self.completed.items() if g not in self.dropped for e in ids}

    def restored(self) -> set[str]:
        """Executions trained episodes lost and restored by replay (checked: the screen last
        seen, shown again)."""
        return {e for g, ids in self.lost.items() if g not in self.dropped for e in ids}


# --------------------------------------------------------------------------- one job (parent)
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], limit_s: float = 120.0) -> dict[str, Any]:
    """Bounded polling of the gym server's capabilities (a bench may poll); returns them."""
    import httpx

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gym server exited with {proc.returncode}")
        try:
            answer = httpx.get(f"{url}/api/v1/sim/capabilities", timeout=2.0)
            if answer.status_code == 200:
                caps: dict[str, Any] = answer.json()
                return caps
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"gym server at {url} not ready within {limit_s} s")


def processes_tagged(tag: str) -> list[int]:
    """Pids of live processes whose environment carries ``CUA_CHAOS_JOB=tag``."""
    found = []
    needle = f"CUA_CHAOS_JOB={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def start_gym_server(
    profile: dict[str, Any], env: dict[str, str], gym_log: Path, tries: int = 3
) -> tuple[subprocess.Popen[bytes], str, dict[str, Any]]:
    """The faulty gym server on a free port, ready; another port when it exits before it is
    (a port another run took between the probe and the bind). Returns it, its URL and its
    capabilities."""
    for attempt in range(1, tries + 1):
        port = free_port()
        with gym_log.open("ab") as log:
            server = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "cua_native.gym.server",
                    "--port",
                    str(port),
                    "--screenshot-size",
                    "160x384",
                    "--fault-profile",
                    json.dumps(profile),
                    "--idle-ttl-s",
                    "0",
                    "--log-level",
                    "info",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            return server, url, wait_ready(url, server)
        except RuntimeError:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
            if attempt == tries:
                raise
    raise AssertionError("unreachable")


def one_run_command(args: argparse.Namespace, seed: int, job_dir: Path, *extra: str) -> list[str]:
    """This script as one (seed, level) run's process (``--one``) in ``job_dir/run``."""
    return [
        sys.executable,
        __file__,
        "--one",
        "--seed",
        str(seed),
        "--run-dir",
        str(job_dir / "run"),
        "--steps",
        str(args.steps),
        "--eval-episodes",
        str(args.eval_episodes),
        "--threads",
        str(args.threads),
        *extra,
    ]


def build_warm_start(args: argparse.Namespace, seed: int) -> None:
    """The seed's warm start, built once before its levels run at once (they share it)."""
    job_dir = Path(args.work) / f"seed{seed}" / "warm-build"
    job_dir.mkdir(parents=True, exist_ok=True)
    threads = str(args.threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    command = one_run_command(args, seed, job_dir, "--warm-only")
    with (job_dir / "warm.log").open("wb") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"seed {seed}: the warm start failed (see {job_dir / 'warm.log'})")


def run_job(args: argparse.Namespace, seed: int, level: float, out: Path) -> dict[str, Any]:
    import httpx

    name = f"seed{seed}-{level_name(level)}"
    job_dir = Path(args.work) / f"seed{seed}" / level_name(level)
    job_dir.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{name}"
    threads = str(args.threads)
    env = {
        **os.environ,
        "CUA_CHAOS_JOB": tag,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
    }
    profile = fault_profile(level, seed, args.stall_s, args.slow_create_s)
    gym_log = job_dir / "gym.log"
    gym_log.write_bytes(b"")  # this run's faults only
    server, url, capabilities = start_gym_server(profile, env, gym_log)
    started = time.monotonic()
    result_path = job_dir / "result.json"
    leaks: dict[str, Any] = {}
    try:
        with (job_dir / "train.log").open("wb") as log:
            train = subprocess.run(
                one_run_command(
                    args,
                    seed,
                    job_dir,
                    "--level",
                    str(level),
                    "--gym-url",
                    url,
                    "--result",
                    str(result_path),
                    *(["--baseline"] if args.baseline else []),
                    "--engine-faults",
                    json.dumps(engine_faults(level, seed, args.engine_stall_s)),
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                check=False,
            )
        listing = httpx.get(f"{url}/api/v1/sim/executions", timeout=10.0).json()
        leaks["held_executions"] = len(listing["executions"]) + len(listing["creating"])
        # what was held, for the note: live executions and creations still running
        leaks["held"] = {"executions": listing["executions"], "creating": listing["creating"]}
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            leaks["gym_server_rc"] = server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            leaks["gym_server_rc"] = server.wait()
    leaks["processes_left"] = len(processes_tagged(tag))
    wall = time.monotonic() - started
    keyed = capabilities.get("idempotent_actions") is True
    faults, damaged, repeated = read_gym_log(gym_log.read_text(errors="replace"), keyed)
    if train.returncode != 0 or not result_path.is_file():
        return {"seed": seed, "level": level, "failed": train.returncode, "wall_s": wall}
    result = json.loads(result_path.read_text())
    trained = set(result.pop("trained_executions"))
    restored = set(result.pop("restored_executions"))
    result.update(
        wall_s=wall,
        gym_faults=dict(faults),
        repeated_actions=repeated,
        damaged_executions=len(damaged),
        damaged_trained=sorted(damaged & trained),
        damaged_restored=len(damaged & restored),
        trained_executions=len(trained),
        leaks=leaks,
        monitor_steps=monitor_step_metrics(Path(result["monitor_db"])),
    )
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    return result


def read_gym_log(text: str, keyed_actions: bool) -> tuple[Counter[str], set[str], int]:
    """The gym server's log: faults by kind, the executions a fault damaged (a crash; a fault
    of an action too unless the server honours idempotency keys), and the actions answered
    from its store (a retried action that did not run twice)."""
    faults = Counter[str]()
    damaged: set[str] = set()
    repeated = 0
    for line in text.splitlines():
        if "repeated action key=" in line:
            repeated += 1
        match = FAULT_LINE.search(line)
        if match is None:
            continue
        kind, route, path = match.groups()
        faults[kind] += 1
        parts = path.strip("/").split("/")
        if len(parts) >= 5 and parts[3] == "executions":
            action_damage = not keyed_actions and kind in ACTION_DAMAGING
            if kind in DAMAGING or (route == "actions" and action_damage):
                damaged.add(parts[4])
    return faults, damaged, repeated


def monitor_step_metrics(db: Path) -> list[dict[str, Any]]:
    """The monitor's own step rows: status and the fault figures in ``metrics_json``."""
    if not db.is_file():
        return []
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT step, status, metrics_json FROM step ORDER BY step").fetchall()
    return [{"step": s, "status": st, **json.loads(m or "{}")} for s, st, m in rows]


# --------------------------------------------------------------------------- analysis
def keyed(result: dict[str, Any]) -> dict[str, list[bool]]:
    seed = result["seed"]
    return {f"{seed}:{task}": v for task, v in result["final_outcomes"].items()}


def analyse(out: Path) -> dict[str, Any]:
    from cua_native.rollout.outcomes import paired_difference, success_rate, task_interval

    runs = [
        json.loads(p.read_text())
        for p in sorted(out.glob("seed*-L*.json"))
        if "failed" not in json.loads(p.read_text())
    ]
    by = {(r["seed"], r["level"]): r for r in runs}
    levels = sorted({r["level"] for r in runs})
    clean = {seed: r for (seed, lv), r in by.items() if lv == 0.0}
    summary: dict[str, Any] = {"levels": {}, "ok": True}
    print(
        "\nfinal-evaluation success per level (pooled over seeds; 95 % bootstrap over seed x task)"
    )
    for level in levels:
        seeds = sorted(s for (s, lv) in by if lv == level and s in clean)
        pooled: dict[str, list[bool]] = {}
        base: dict[str, list[bool]] = {}
        for seed in seeds:
            pooled.update(keyed(by[(seed, level)]))
            base.update(keyed(clean[seed]))
        if not pooled:
            continue
        own = task_interval(pooled)
        rows = [by[(s, level)] for s in seeds]
        steps = [st for r in rows for st in r["steps"]]
        faults = Counter[str]()
        for r in rows:
            faults.update(r["gym_faults"])
        engine = Counter[str]()
        for r in rows:
            engine.update({k: v for k, v in r["engine_faults"].items() if k != "stalled_s"})
        entry: dict[str, Any] = {
            "seeds": seeds,
            "success": success_rate(pooled),
            "interval": [own.low, own.high],
            "per_seed": {s: success_rate(keyed(by[(s, level)])) for s in seeds},
            "gym_faults": dict(faults),
            "engine_faults": dict(engine),
            "rejected_episodes": sum(st["rejected_episodes"] for st in steps),
            "dropped_groups": sum(st["rejected_groups"] for st in steps),
            "retries": sum(st["retries"] for st in steps),
            "retry_wait_s": sum(st["retry_wait_s"] for st in steps),
            "rejected_s": sum(st["rejected_s"] for st in steps),
            "recovered_episodes": sum(st.get("recovered_episodes", 0) for st in steps),
            "restored_executions": sum(st.get("restored", 0) for st in steps),
            "engine_retries": sum(st.get("engine_retries", 0) for st in steps),
            "recovery_s": sum(st.get("recovery_s", 0.0) for st in steps),
            "repeated_actions": sum(r.get("repeated_actions", 0) for r in rows),
            "damaged_restored": sum(r.get("damaged_restored", 0) for r in rows),
            "rollout_share": [st["rollout_share"] for st in steps],
            "step_success": sum(st["success_rate"] for st in steps) / len(steps),
            "step_turns": sum(st["turns_mean"] for st in steps) / len(steps),
            "trained_samples": sum(st["samples"] for st in steps),
            "final_episodes": sum(len(v) for v in pooled.values()),
            "damaged_executions": sum(r["damaged_executions"] for r in rows),
            "damaged_trained": sum(len(r["damaged_trained"]) for r in rows),
            "leaks": [r["leaks"] for r in rows],
            "wall_s": [r["wall_s"] for r in rows],
        }
        if level > 0.0:
            diff = paired_difference(base, pooled)
            entry["paired_difference"] = [diff.estimate, diff.low, diff.high]
            clean_iv = summary["levels"]["0.0"]["interval"]
            entry["within_clean_interval"] = clean_iv[0] <= entry["success"] <= clean_iv[1]
        summary["levels"][str(level)] = entry
        share = entry["rollout_share"]
        line = (
            f"  {level:4.0%}: success {entry['success']:.1%} [{own.low:.1%}, {own.high:.1%}]"
            f" per seed {', '.join(f'{v:.0%}' for v in entry['per_seed'].values())}"
        )
        if "paired_difference" in entry:
            d = entry["paired_difference"]
            line += f"; vs fault-free {d[0]:+.1%} [{d[1]:+.1%}, {d[2]:+.1%}]"
            line += " within" if entry["within_clean_interval"] else " OUTSIDE"
            line += " the fault-free interval"
        print(line)
        print(
            f"        gym faults {dict(faults)}; engine {dict(engine)}; "
            f"rejected episodes {entry['rejected_episodes']}, dropped groups "
            f"{entry['dropped_groups']}, rejected episodes ran {entry['rejected_s']:.0f} s"
        )
        print(
            f"        recovered at the call: {entry['recovered_episodes']} episodes completed "
            f"after recovering; gym retries {entry['retries']} (of them actions answered from "
            f"the server's store: {entry['repeated_actions']}), executions restored by replay "
            f"{entry['restored_executions']} (crashed ones in trained episodes: "
            f"{entry['damaged_restored']}), model calls retried {entry['engine_retries']}; "
            f"time lost waiting {entry['retry_wait_s'] + entry['recovery_s']:.0f} s (gym "
            f"retries: failed attempts and the waits before them {entry['retry_wait_s']:.0f} s; "
            f"restores and model backoff {entry['recovery_s']:.0f} s)"
        )
        print(
            f"        steps: success {entry['step_success']:.0%}, turns {entry['step_turns']:.2f}"
            f" (completed episodes), {entry['trained_samples']} rows trained on; final"
            f" evaluation over {entry['final_episodes']} completed episodes"
        )
        print(
            f"        rollout share of each step: mean {sum(share) / len(share):.0%}, "
            f"min {min(share):.0%}, max {max(share):.0%}; damaged executions "
            f"{entry['damaged_executions']}, of them trained on: {entry['damaged_trained']}; "
            f"leaks {entry['leaks']}"
        )
        bad_leak = any(
            lk.get("held_executions") or lk.get("processes_left") for lk in entry["leaks"]
        )
        if entry["damaged_trained"] or bad_leak:
            summary["ok"] = False
    for r in runs:
        print(
            f"\nseed {r['seed']} level {r['level']:.0%}: rollout share per step "
            + " ".join(f"{st['rollout_share']:.0%}" for st in r["steps"])
        )
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, runs, out / "chaos.png")
    return summary


def _colour(level: float) -> str:
    return {0.0: "C0", 0.05: "C1", 0.2: "C3"}.get(round(level, 4), "C7")


def plot(summary: dict[str, Any], runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2))
    levels = sorted(summary["levels"], key=float)
    for i, level in enumerate(levels):
        entry = summary["levels"][level]
        lo, hi = entry["interval"]
        ax1.errorbar(
            [i],
            [entry["success"]],
            yerr=[[entry["success"] - lo], [hi - entry["success"]]],
            fmt="o",
            color="k",
            capsize=6,
        )
        for value in entry["per_seed"].values():
            ax1.plot([i + 0.08], [value], "x", color="grey")
    if "0.0" in summary["levels"]:
        lo, hi = summary["levels"]["0.0"]["interval"]
        ax1.axhspan(lo, hi, color="C0", alpha=0.12, label="fault-free 95 % interval")
        ax1.legend(loc="lower left")
    ax1.set_xticks(range(len(levels)), [f"{float(lv):.0%}" for lv in levels])
    ax1.set_xlabel("faults per call")
    ax1.set_ylabel("final-evaluation success")
    ax1.set_ylim(0, 1)
    for r in runs:
        ax2.plot(
            [st["rollout_share"] for st in r["steps"]],
            color=_colour(r["level"]),
            alpha=0.7,
            label=f"{r['level']:.0%}",
        )
    handles, labels = ax2.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    ax2.legend(unique.values(), unique.keys(), title="faults per call")
    ax2.set_xlabel("step")
    ax2.set_ylabel("rollout share of the step (one line per run)")
    ax2.set_ylim(0, 1)
    width = 0.25
    for i, level in enumerate(levels):
        entry = summary["levels"][level]
        values = [
            entry["rejected_episodes"],
            entry["dropped_groups"],
            entry["retries"],
            entry["damaged_trained"],
        ]
        ax3.bar(
            [x + i * width for x in range(4)],
            values,
            width,
            label=f"{float(level):.0%}",
            color=_colour(float(level)),
        )
    ax3.set_xticks(
        [x + width for x in range(4)],
        ["rejected\nepisodes", "dropped\ngroups", "gym\nretries", "damaged\ntrained on"],
    )
    ax3.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# --------------------------------------------------------------------------- entry
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", type=float, nargs="+", default=list(LEVELS))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--steps", type=int, default=8, help="GRPO steps (the default: 24)")
    parser.add_argument("--eval-episodes", type=int, default=2, help="per task and phone")
    parser.add_argument("--baseline", action="store_true", help="also the baseline evaluation")
    parser.add_argument(
        "--stall-s", type=float, default=6.0, help="gym hang (client gives up at 4)"
    )
    parser.add_argument("--slow-create-s", type=float, default=3.0)
    parser.add_argument("--engine-stall-s", type=float, default=1.0)
    parser.add_argument(
        "--jobs", type=int, default=1, help="runs at once (9: every seed and level of the default)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads per run")
    parser.add_argument("--out", default="bench/experiments/results/chaos-bench")
    parser.add_argument("--work", default="runs/chaos")
    parser.add_argument("--analyse", metavar="DIR", default=None)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--warm-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--level", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--gym-url", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--engine-faults", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        return run_one(args)
    if args.analyse:
        return 0 if analyse(Path(args.analyse))["ok"] else 1
    if any(not 0.0 <= lv <= 1.0 for lv in args.levels):
        parser.error("--levels: shares in [0, 1] (0: the fault-free run each level is paired with)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def one_run(job: tuple[int, float]) -> None:
        seed, level = job
        started = time.monotonic()
        result = run_job(args, seed, level, out)
        print(
            f"seed {seed} level {level:.0%}: "
            + ("FAILED" if "failed" in result else f"eval {result['evals']}")
            + f" ({time.monotonic() - started:.0f} s)",
            flush=True,
        )

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(lambda seed: build_warm_start(args, seed), args.seeds))
        jobs = [(seed, level) for level in sorted(args.levels) for seed in args.seeds]
        list(pool.map(one_run, jobs))
    return 0 if analyse(out)["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
