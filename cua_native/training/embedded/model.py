"""The model an embedded run starts from, and its inference engine: one definition for the
trainer and ``python -m cua_native.evaluate``, so both measure the same policy.

``cua.agent.model_path`` when it is set; else the tiny Qwen3-VL (built once, cached beside the
run directory), warm-started when ``cua.warm_start.enabled`` on the simulator's solution paths,
or with ``gym.kind: desktop`` on the desktop demonstrator's episodes (cached under a key of
everything the warm start depends on, so a second run reuses it). The
engine is the in-process one on ``cua.device``, seeded with the run's ``seed``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cua_native.config import LoadedConfig

if TYPE_CHECKING:  # torch and transformers: only once a caller loads a model
    from cua_native.engine import InProcessEngine


@dataclass(frozen=True, slots=True)
class StartingModel:
    path: Path
    warm_start: dict[str, Any] | None = None
    """``{"reused": dir}`` for a cached warm start, the warm start's figures for a fresh one,
    ``None`` without one."""


def cache_dir(loaded: LoadedConfig) -> Path:
    """Where built and warm-started models are kept: ``.cache`` beside the run directory."""
    return Path(loaded.cua.run_dir).parent / ".cache"


def prepare_model(loaded: LoadedConfig, *, progress: bool = True) -> StartingModel:
    """The starting model's directory (a blocking job: call it in a thread from async code)."""
    from cua_native.rollout.factories import resolve_model_path

    cua = loaded.cua
    cache = cache_dir(loaded)
    model_dir = resolve_model_path(cua.agent.model_path, cache)
    if cua.agent.model_path is not None or not cua.warm_start.enabled:
        return StartingModel(model_dir)
    from cua_native.training.warmstart.demos import DemoSource, source_for
    from cua_native.training.warmstart.sft import WARM_START_MARKER, warm_start, warm_start_key

    gym = cua.agent.gym
    sim_options = gym.options if gym.kind == "sim" else {}
    source: DemoSource = source_for(cua.agent.family, sim_options)
    limits: dict[str, Any] = {}
    if gym.kind == "desktop":  # the demonstrator on local desktops (docs/desktop.md)
        from cua_native.training.warmstart.desktop import desktop_source_for

        sim_options = {"desktop": gym.options}
        source = desktop_source_for(gym.options)
        limits = {"demo_concurrency": 2, "demo_timeout_s": cua.agent.turn_timeout_s}
    key = warm_start_key(
        cua.agent.family,
        cua.warm_start,
        cua.agent.prompt,
        sim_options,
        tasks=cua.tasks,
        base=model_dir.name,
    )
    target = cache / f"tiny-qwen3-vl-warm-{cua.agent.family}-{key}"
    if (target / WARM_START_MARKER).is_file():
        return StartingModel(target, {"reused": str(target)})
    result = warm_start(
        model_dir,
        target,
        cua.warm_start,
        family=cua.agent.family,
        prompt_overrides=cua.agent.prompt,
        progress=progress,
        tasks=cua.tasks,
        gym_seeds=tuple(cua.warm_start.gym_seeds),
        demo_source=source,
        **limits,
    )
    return StartingModel(target, dataclasses.asdict(result))


async def load_inference_engine(loaded: LoadedConfig, model_dir: Path) -> InProcessEngine:
    """The in-process engine on ``cua.device``, seeded with ``seed`` (loaded in a thread)."""
    from cua_native.engine import InProcessEngine

    return await asyncio.to_thread(
        InProcessEngine.from_pretrained,
        str(model_dir),
        device=loaded.cua.device,
        seed=loaded.areal.seed,
    )
