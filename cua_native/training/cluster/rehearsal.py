"""``python -m cua_native.train --config CONFIG --rehearse``: the cluster run, on this machine.

The same config and the same AReaL code path — ``PPOTrainer`` (``CUAPPOTrainer``) with its
scheduler (a Ray config keeps AReaL's Ray scheduler, on a Ray cluster of this machine; any other
config runs on AReaL's local scheduler), rollout executor, AReaL's remote engine client, the
FSDP actor, weight updates, evals and checkpoints — with local stand-ins for the cluster's
outside parts:

- the gym: the simulator served over HTTP (``python -m cua_native.gym.server``) under the
  config's ``gym_id``, screenshots rendered small;
- the model: the tiny Qwen3-VL (``cua_native/models/tiny.py``) or ``--model``;
- the inference server: ``python -m cua_native.engine.serve`` speaking the configured backend's
  API (SGLang or vLLM) from the in-process engine; the trainer attaches to it.

On Ray (``scheduler.type: ray``) the rehearsal starts a local Ray cluster (``ray.init``; with
``RAY_ADDRESS`` set it attaches to that cluster instead) and stops it on every way out (error,
SIGTERM); the workers are Ray actors AReaL's Ray scheduler places, whose ``CUA_*`` environment
comes from the scheduling specs; the gym and the stand-in server listen on this host's
non-loopback address (AReaL's ``gethostip``, as its callback server) where the OS has one, and the
workers reach them there. Each spec asks for one CPU and 1 GiB (the local cluster declares
``RAY_CPUS`` logical CPUs); the checks of spanning nodes (``multinode``) are skipped, as the
cluster is this one host.

What it may change, and prints: the allocation (one local process each), the model, the gym,
the sizes (tasks per step, group, turns, tokens), on CPU flash attention becomes ``sdpa`` (then
the actor packs rows with ``training.packing.PACKED_SDPA``; on a GPU with micro-batches of at
most ``GPU_MAX_TOKENS_PER_MB`` tokens unless the config sets a cap), and on one GPU an ``xccl`` weight update becomes ``disk`` (the
server and the actor share the device; NCCL needs two).
What it keeps: the backend, the family/dialect and prompts, the pixel-budget rules (``max_pixels``
is clamped into the stand-in model's budget and checked like any other), the workflow and its
kwargs, and the weight-update mode: on CPU ``xccl`` runs AReaL's own collective path over
``gloo`` (what AReaL's CPU platform uses), on two GPUs over NCCL.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cua_native.config import LoadedConfig, load_config

RAY_CPUS = 4
"""Logical CPUs of the rehearsal's local Ray cluster: the actor's placement group and the
rollout's (one each), AReaL's master-address probe and room to spare; not cores it uses."""
RAY_START_ATTEMPTS = 3
"""Tries at starting the local Ray cluster (``_start_local_ray``)."""
RAY_NO_UV_ENV = "RAY_ENABLE_UV_RUN_RUNTIME_ENV"
"""Under ``uv run`` Ray builds each worker a fresh environment from the working directory
(minutes, and its workers then start in a copy of it); with ``0`` the rehearsal's workers run
this interpreter, as on a cluster with one image. Ray reads it when it is imported."""
SIM_SCREENSHOT = "216x480"
"""The simulated phone's screenshots (1080x2400 scaled by 1/5): ~100 image tokens each."""
READY_TIMEOUT_S = 600.0
GPU_MAX_TOKENS_PER_MB = 9000
"""Token cap of a packed micro-batch in a GPU rehearsal without flash-attn: one episode of the
rehearsal's rows at the real pixel budget (two turns, ~8.8k tokens), ~1.6x its longest row."""


@dataclass
class Rehearsal:
    """The overrides rehearsal applies, each with the reason printed beside it."""

    overrides: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    user_keys: frozenset[str] = frozenset()
    """Fields the user overrode on the command line: theirs win, rehearsal leaves them."""

    def set(self, key: str, value: object, why: str) -> None:
        if key in self.user_keys:
            return
        shown = "null" if value is None else value
        self.overrides.append(f"{key}={shown}")
        self.reasons.append(f"  {key} = {shown}  ({why})")


RAY_FIXED_PORTS = frozenset({6379, 8265, 10001, 52365, 52366})
"""Ports a local Ray cluster takes by default once it starts (GCS, dashboard, client server,
dashboard agent HTTP/gRPC): a port picked free before Ray starts must not be one of them."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, never one of Ray's fixed defaults."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in RAY_FIXED_PORTS:
            return port


def host_address() -> str:
    """This host's non-loopback IPv4 address (AReaL's ``gethostip``: what its workers and
    callback server use), or ``127.0.0.1`` where the OS has none to bind."""
    from areal.utils.network import gethostip

    try:
        address = str(gethostip())
        with socket.socket() as s:
            s.bind((address, 0))
    except (RuntimeError, OSError):
        return "127.0.0.1"
    return address


def _start_local_ray(ray: Any) -> None:
    """``ray.init`` of a new local cluster, tried ``RAY_START_ATTEMPTS`` times: Ray gives its
    raylet a fixed 30 s to register with the GCS, which a loaded machine can miss ("The current
    node timed out during startup"). The processes a failed attempt started are stopped by pid
    before the next."""
    import psutil

    me = psutil.Process()
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        before = {child.pid for child in me.children(recursive=True)}
        try:
            ray.init(address="local", num_cpus=RAY_CPUS, include_dashboard=False)
            return
        except Exception as error:  # Ray raises a bare Exception here
            if "timed out during startup" not in str(error) or attempt == RAY_START_ATTEMPTS:
                raise
        for child in me.children(recursive=True):
            if child.pid not in before:
                with contextlib.suppress(psutil.Error):
                    child.kill()
        ray.shutdown()
        print(f"ray: the local cluster did not start in time; attempt {attempt + 1}", flush=True)


@contextlib.contextmanager
def ray_cluster() -> Iterator[str]:
    """A Ray cluster for the rehearsal: ``RAY_ADDRESS``'s if set, else a new local one of
    ``RAY_CPUS`` logical CPUs (``RAY_NO_UV_ENV`` must be set before Ray is imported: ``train``
    does). ``ray.shutdown`` on every way out stops the local cluster's processes (and with them
    every actor); on an attached cluster AReaL's scheduler has deleted its actors and placement
    groups before (``CUAPPOTrainer.close``). Yields what it did."""
    import signal

    import ray

    address = os.environ.get("RAY_ADDRESS")
    sigterm = signal.getsignal(signal.SIGTERM)
    if address:
        ray.init(address=address, include_dashboard=False)
        what = f"attached to the Ray cluster at {address}"
    else:
        _start_local_ray(ray)
        what = f"a local Ray cluster ({RAY_CPUS} logical CPUs)"
    # ray.init makes SIGTERM a bare sys.exit; the caller's handler (handle_sigterm) stays
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, sigterm)
    try:
        yield what
    finally:
        ray.shutdown()


def plan_rehearsal(
    loaded: LoadedConfig,
    *,
    steps: int,
    run_dir: Path,
    model: Path,
    device: str,
    gym_url: str,
    processor_budget: int,
    gpus: int = 0,
    flash_attn: bool = False,
    user_keys: frozenset[str] = frozenset(),
) -> Rehearsal:
    """The overrides that turn a cluster config into a rehearsal on this machine."""
    areal, cua = loaded.areal, loaded.cua
    backend = areal.rollout.backend.split(":", 1)[0]
    r = Rehearsal(user_keys=user_keys)
    r.set("cua.run_dir", run_dir, "--run-dir")
    r.set("cua.monitor_db", "sqlite", "the lifecycle goes to RUN_DIR/monitor.db")
    r.set("cua.monitor_url", None, "no remote monitor in a rehearsal")
    for key in ("actor.path", "tokenizer_path", "cua.agent.model_path"):
        r.set(key, model, "the stand-in model")
    r.set("sglang.model_path" if backend == "sglang" else "vllm.model", model, "the stand-in model")
    r.set("allocation_mode", "''", "one local process per role")
    r.set("actor.backend", "fsdp:d1", "one local actor process")
    r.set("rollout.backend", f"{backend}:d1", f"one local {backend} stand-in server")
    if areal.scheduler.type != "ray":
        r.set("scheduler.type", "local", "workers are local processes")
    r.set("cluster.fileroot", run_dir / "areal", "checkpoints and disk weight updates in RUN_DIR")
    r.set("cluster.name_resolve.type", "nfs", "a local name_resolve directory")
    r.set("cluster.name_resolve.nfs_record_root", run_dir / "name_resolve", "in RUN_DIR")
    if device == "cpu":
        if areal.actor.attn_impl != "sdpa":
            r.set(
                "actor.attn_impl",
                "sdpa",
                "flash attention needs a GPU; rows packed under sdpa (PACKED_SDPA)",
            )
        r.set("actor.dtype", "float32", "CPU")
    else:
        if areal.actor.weight_update_mode == "xccl" and gpus < 2:
            r.set(
                "actor.weight_update_mode",
                "disk",
                "one GPU holds both the server and the actor; NCCL needs two devices",
            )
        if areal.actor.attn_impl.startswith("flash_attention") and not flash_attn:
            r.set(
                "actor.attn_impl",
                "sdpa",
                "flash-attn is not installed; rows packed under sdpa (PACKED_SDPA)",
            )
            if areal.actor.mb_spec.max_tokens_per_mb is None:
                r.set(
                    "actor.mb_spec.max_tokens_per_mb",
                    GPU_MAX_TOKENS_PER_MB,
                    "packed micro-batches bounded: the actor shares the GPU with the server",
                )
    scaled: str | None
    value: object
    for scaled, value in (
        # one step per epoch at least: AReaL stops after epochs x (tasks / batch) steps
        ("total_train_steps", steps),
        ("total_train_epochs", steps),
        ("train_dataset.batch_size", 2),
        ("rollout.max_concurrent_rollouts", 2),
        ("actor.ppo_n_minibatches", 1),
        ("saver.freq_steps", steps),
        ("cua.eval_every", 1 if cua.eval_tasks is not None else 0),
        ("cua.tasks.limit", 4),
        ("cua.eval_tasks.limit", 2) if cua.eval_tasks else (None, None),
        ("cua.agent.group_size", 2),
        ("cua.agent.max_turns", 2),
        ("cua.agent.sampling.max_new_tokens", 16),  # gconfig follows (derived)
        ("cua.agent.prompt.max_context_tokens", 8192),
    ):
        if scaled is not None and value is not None:
            r.set(scaled, value, "sizes scaled down")
    configured = cua.agent.prompt.get("max_pixels")
    if configured is None or int(configured) > processor_budget:
        r.set(
            "cua.agent.prompt.max_pixels",
            processor_budget,
            "the stand-in model processor's budget (kept inside it, as the check demands)",
        )
    r.set("cua.agent.gym.base_url", gym_url, "the simulator over HTTP")
    r.set("recover.mode", "disabled", "a rehearsal starts fresh")
    return r


def _watch_ready(process: subprocess.Popen[str], marker: str, name: str, log: Path) -> None:
    """Wait until ``process`` prints a line containing ``marker``; the rest goes to ``log``."""
    ready = threading.Event()

    def pump() -> None:
        assert process.stdout is not None
        with log.open("a") as out:
            for line in process.stdout:
                out.write(line)
                out.flush()
                if marker in line:
                    ready.set()

    threading.Thread(target=pump, name=f"{name}-log", daemon=True).start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready.wait(1.0):
        if process.poll() is not None:
            time.sleep(0.5)  # let the pump write the last lines
            tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
            raise RuntimeError(
                f"{name} exited with {process.returncode} before it was ready; {log}:\n{tail}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} not ready after {READY_TIMEOUT_S:.0f} s; see {log}")


@contextlib.contextmanager
def _process(
    cmd: list[str], marker: str, name: str, log: Path, extra_env: dict[str, str] | None = None
) -> Iterator[None]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    process = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        _watch_ready(process, marker, name, log)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def rehearse(
    config_path: str,
    overrides: list[str],
    *,
    steps: int,
    run_dir: Path,
    model: str | None,
    device: str,
    dtype: str | None = None,
) -> int:
    """Rehearse ``config_path``; returns the exit code (0 after ``steps`` steps)."""
    from cua_native.monitor.client.lifecycle import handle_sigterm
    from cua_native.rollout.factories import load_processor, tiny_model_dir
    from cua_native.training.cluster.checks import pixel_budget
    from cua_native.training.cluster.run import run_cluster

    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    for sub in ("areal", "name_resolve", "logs"):
        (run_dir / sub).mkdir(exist_ok=True)
    from cua_native.training.cluster.checks import check_cluster_config

    loaded = load_config(config_path, overrides)
    check_cluster_config(loaded)  # the config as it would run on the cluster
    model_dir = Path(model) if model else tiny_model_dir()
    budget = pixel_budget(load_processor(model_dir))[1]
    gpus, server_env = 0, {}
    if device != "cpu":
        import torch

        gpus = torch.cuda.device_count()
        if gpus >= 2:  # the server on the last GPU, the actor on the first
            server_env = {"CUDA_VISIBLE_DEVICES": str(gpus - 1)}
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    flash_attn = importlib.util.find_spec("flash_attn") is not None
    on_ray = loaded.areal.scheduler.type == "ray"
    host = host_address() if on_ray else "127.0.0.1"
    gym_port, server_port = free_port(host), free_port(host)
    gym_url = f"http://{host}:{gym_port}"
    plan = plan_rehearsal(
        loaded,
        steps=steps,
        run_dir=run_dir,
        model=model_dir.resolve(),
        device=device,
        gym_url=gym_url,
        processor_budget=budget,
        gpus=gpus,
        flash_attn=flash_attn,
        user_keys=frozenset(o.split("=", 1)[0] for o in overrides),
    )
    rehearsed = load_config(config_path, [*plan.overrides, *overrides])
    check_cluster_config(rehearsed, one_host=True)
    # the stand-in server is started here, not by AReaL: the rollout workers are clients only
    for spec in rehearsed.areal.rollout.scheduling_spec:
        spec.gpu = 0
    actor_gpus = 1 if device != "cpu" else 0
    for spec in rehearsed.areal.actor.scheduling_spec:
        spec.gpu = actor_gpus
    plan.reasons.append(
        f"  actor.scheduling_spec[*].gpu = {actor_gpus}, "
        "rollout.scheduling_spec[*].gpu = 0  (the rollout workers only attach)"
    )
    if on_ray:
        for spec in [
            *rehearsed.areal.actor.scheduling_spec,
            *rehearsed.areal.rollout.scheduling_spec,
        ]:
            spec.cpu, spec.mem = 1, 1
        plan.reasons.append(
            "  {actor,rollout}.scheduling_spec[*].cpu = 1, .mem = 1  (a Ray cluster of one "
            f"host); gym and stand-in server on {host}"
            + ("" if host != "127.0.0.1" else " (this host has no other address to bind)")
        )
    backend = rehearsed.areal.rollout.backend.split(":", 1)[0]
    print(f"rehearsal of {config_path} on {device} ({backend}); changed:")
    print("\n".join(plan.reasons))
    mode = rehearsed.areal.actor.weight_update_mode
    collective = {"cpu": " over gloo"}.get(device, " over nccl") if mode == "xccl" else ""
    print(
        "kept: backend, family/dialect/prompt, pixel-budget rules, workflow and its kwargs, "
        f"weight-update mode ({mode}{collective})" + (", scheduler (ray)" if on_ray else "")
    )
    gym_cmd = [
        sys.executable,
        "-m",
        "cua_native.gym.server",
        "--host",
        host,
        "--port",
        str(gym_port),
        "--gym-id",
        rehearsed.cua.agent.gym.gym_id,
        "--log-level",
        "info",
        # on CPU small screenshots; on GPU the phone's own 1080x2400 at the real pixel budget
        *(["--screenshot-size", SIM_SCREENSHOT] if device == "cpu" else []),
    ]
    serve_cmd = [
        sys.executable,
        "-m",
        "cua_native.engine.serve",
        "--backend",
        backend,
        "--model",
        str(model_dir.resolve()),
        "--host",
        host,
        "--port",
        str(server_port),
        "--device",
        device,
        *(["--dtype", dtype] if dtype else []),
    ]
    logs = run_dir / "logs"
    with (
        handle_sigterm(),  # SIGTERM raises: the stand-ins below are stopped on the way out
        ray_cluster() if on_ray else contextlib.nullcontext("") as cluster,
        _process(gym_cmd, "Uvicorn running", "gym server", logs / "gym.log"),
        _process(
            serve_cmd, "serving ", f"{backend} stand-in server", logs / "serve.log", server_env
        ),
    ):
        if cluster:
            print(f"ray: {cluster}", flush=True)
        run_cluster(rehearsed, attach=[f"{host}:{server_port}"], one_host=True)
    print(f"rehearsal done: {steps} steps; monitor lifecycle in {run_dir / 'monitor.db'}")
    return 0
