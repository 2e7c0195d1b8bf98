"""``python -m cua_native.train``: GRPO training of a GUI agent.

With no arguments it runs the embedded default on this machine (CPU is enough): the simulated
phone, a tiny Qwen3-VL built locally and warm-started on the simulator's solution paths, the
in-process engine, and AReaL's own PPO/GRPO code. With ``--config configs/<name>.yaml`` whose
``cua.mode`` is ``areal`` it trains with AReaL's PPOTrainer on a GPU cluster.

Trailing ``key=value`` arguments override config fields (``total_train_steps=10``,
``cua.agent.group_size=8``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cua_native import cli_checks

if TYPE_CHECKING:  # the config loader imports AReaL: only once the command line is checked
    from cua_native.config import LoadedConfig


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m cua_native.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="YAML config (default: the embedded default)")
    parser.add_argument("--model", help="model directory to train instead of the tiny model")
    parser.add_argument("--run-dir", help="where the monitor database, checkpoints and logs go")
    parser.add_argument("--steps", type=int, help="training steps (total_train_steps)")
    parser.add_argument("--device", help="cpu or cuda (embedded mode)")
    parser.add_argument(
        "--gym-url",
        help="train on the gym server at this base URL (cua.agent.gym.kind=http; the config's "
        "other gym settings that apply to an HTTP gym are kept)",
    )
    parser.add_argument("--monitor", help="also record to a Training Monitor at this base URL")
    parser.add_argument("--monitor-token", help="bearer token for --monitor (or CUA_MONITOR_TOKEN)")
    parser.add_argument(
        "--no-warm-start", action="store_true", help="skip the supervised warm start"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="cluster configs: run the same AReaL PPOTrainer path on this machine with local "
        "stand-ins (simulator gym, tiny or --model model, stand-in inference server); "
        "prints what it changes; default 2 steps",
    )
    parser.add_argument("--dtype", help="--rehearse: the stand-in server's dtype")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    return parser.parse_intermixed_args(argv)  # key=value overrides may stand anywhere


def check_input(args: argparse.Namespace) -> None:
    """Options checkable before importing or loading anything (``BadInput``, one line)."""
    if args.model:
        cli_checks.check_model_dir(args.model)
    if args.device:
        cli_checks.check_device(args.device)
    cli_checks.check_positive(args.steps, "--steps")
    if args.run_dir:
        cli_checks.check_run_dir(args.run_dir)
    if args.monitor:
        cli_checks.check_http_url(args.monitor, "--monitor")
    if args.gym_url and args.rehearse:
        raise cli_checks.BadInput("--gym-url: --rehearse runs its own simulator gym; drop one")
    if args.gym_url:
        url = cli_checks.check_http_url(args.gym_url, "--gym-url")
        cli_checks.check_gym_reachable(url, "sim")


def build_config(args: argparse.Namespace) -> LoadedConfig:
    from cua_native.config import load_config

    overrides = list(args.overrides)
    if args.model:
        overrides += [f"cua.agent.model_path={args.model}", f"actor.path={args.model}"]
    if args.run_dir:
        overrides.append(f"cua.run_dir={args.run_dir}")
    if args.steps is not None:
        overrides.append(f"total_train_steps={args.steps}")
    if args.device:
        overrides.append(f"cua.device={args.device}")
    if args.monitor:
        overrides.append(f"cua.monitor_url={args.monitor}")
    if args.monitor_token:
        overrides.append(f"cua.monitor_token={args.monitor_token}")
    if args.no_warm_start:
        overrides.append("cua.warm_start.enabled=false")
    return load_config(args.config, overrides, gym_url=args.gym_url or None)


def check_trainable(loaded: LoadedConfig) -> None:
    """What training needs beyond a valid config, before any model is prepared: an optimizer
    (AReaL leaves ``actor.optimizer`` unset), the monitor's URL and the store's database (a
    server database must answer). ``ConfigError``, one line."""
    from cua_native.config import ConfigError

    if loaded.areal.actor.optimizer is None:
        raise ConfigError(
            "config error: actor.optimizer is not set; training needs one (e.g. "
            "actor.optimizer.lr=5e-4; configs/default.yaml sets it)"
        )
    cua = loaded.cua
    if cua.monitor_url:
        from cua_native.monitor.client.sinks import check_monitor_url

        try:
            check_monitor_url(cua.monitor_url)
        except ValueError as error:
            raise ConfigError(f"config error: cua.monitor_url: {error}") from None
    try:
        cli_checks.check_monitor_db(cua.monitor_db, "cua.monitor_db")
    except cli_checks.BadInput as error:
        raise ConfigError(f"config error: {error}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        check_input(args)
    except cli_checks.BadInput as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.rehearse:
        return _rehearse(args)
    from cua_native.config import ConfigError

    try:
        loaded = build_config(args)
        check_trainable(loaded)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    if loaded.cua.mode == "areal":
        from cua_native.monitor.client.lifecycle import Terminated
        from cua_native.training.cluster.run import run_cluster

        try:
            run_cluster(loaded)
        except (KeyboardInterrupt, Terminated) as error:
            print(f"train: stopped ({error or 'interrupted'}); workers stopped", file=sys.stderr)
            return 143 if isinstance(error, Terminated) else 130
        return 0
    if loaded.cua.device == "cpu":
        # AReaL torch.compiles its log-prob helper; on CPU the first call spends ~20 s
        # compiling C++ for a few milliseconds of work. Eager mode is exact and faster here.
        import torch._dynamo

        torch._dynamo.config.disable = True
    from cua_native.rollout.runtime import tune_for_rollouts, with_cpu_pool
    from cua_native.training.embedded.report import print_report
    from cua_native.training.embedded.trainer import EmbeddedTrainer

    tune_for_rollouts()
    trainer = EmbeddedTrainer(loaded, progress=not args.no_progress)
    try:
        report = asyncio.run(with_cpu_pool(trainer.run()))
    except (KeyboardInterrupt, asyncio.CancelledError) as error:
        print(f"train: stopped ({error or 'interrupted'}); recorded as cancelled", file=sys.stderr)
        return 143 if "SIGTERM" in str(error) else 130
    print_report(report, step_table=not args.no_progress)
    return 0


def _rehearse(args: argparse.Namespace) -> int:
    """``--rehearse``: checks first (one line, exit 2), then the rehearsal."""
    import os
    from pathlib import Path

    # Ray reads this when imported (AReaL's config imports it): see rehearsal.RAY_NO_UV_ENV
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    from cua_native.config import ConfigError, load_config
    from cua_native.monitor.client.lifecycle import Terminated
    from cua_native.training.cluster.rehearsal import rehearse

    if not args.config:
        print(
            "config error: --rehearse needs --config CONFIG (a cua.mode: areal config)",
            file=sys.stderr,
        )
        return 2
    device = args.device or "cpu"
    steps = args.steps if args.steps is not None else 2
    run_dir = Path(args.run_dir or f"runs/rehearsal-{Path(args.config).stem}")
    if device == "cpu":
        # AReaL torch.compiles helpers; on CPU compiling costs more than it saves (workers
        # inherit the environment)
        os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
        # AReaL gives each worker 8 BLAS threads unless the environment says otherwise
        cores = str(max(1, len(os.sched_getaffinity(0))))
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ.setdefault(var, cores)
    try:
        loaded = load_config(args.config, list(args.overrides))
        if loaded.cua.mode != "areal":
            raise ConfigError(
                "config error: cua.mode: --rehearse rehearses cluster configs "
                f"(cua.mode: areal), got {loaded.cua.mode!r}"
            )
        if any(o.split("=", 1)[0] == "cua.monitor_db" for o in args.overrides):
            # the rehearsal records to RUN_DIR/monitor.db unless the command line says otherwise
            try:
                cli_checks.check_monitor_db(loaded.cua.monitor_db, "cua.monitor_db")
            except cli_checks.BadInput as error:
                raise ConfigError(f"config error: {error}") from None
        return rehearse(
            args.config,
            list(args.overrides),
            steps=steps,
            run_dir=run_dir,
            model=args.model,
            device=device,
            dtype=args.dtype,
        )
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as error:
        print(
            f"rehearsal: stopped ({error or 'interrupted'}); its processes stopped", file=sys.stderr
        )
        return 143 if isinstance(error, Terminated) else 130


if __name__ == "__main__":
    sys.exit(main())
