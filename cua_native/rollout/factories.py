"""The embedded default and the factories behind it: the tiny Qwen3-VL (built once, cached),
the gym named by a ``GymConfig``, and the agent (prompt builder, dialect, gconfig)."""

from __future__ import annotations

import asyncio
import functools
import os
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cua_native.actions.dialects import get_dialect
from cua_native.gym.protocol import Gym
from cua_native.rollout.agent import Agent
from cua_native.rollout.config import AgentConfig, GymConfig

if TYPE_CHECKING:
    import httpx

DEFAULT_CACHE_DIR = Path("runs/.cache")
TINY_MODEL_DIRNAME = "tiny-qwen3-vl"
_READY_MARKER = "cua_native_tiny.json"


def tokenizer_corpus() -> list[str]:
    """What the tiny model's tokenizer is trained on: the generic GUI-agent text of
    ``models.tiny.default_corpus``, every system prompt both dialects render, and the sim's
    task instructions. A tokenizer that has seen the prompts splits them into words, as a real
    checkpoint's does (the MAI-UI system prompt: ~450 tokens instead of ~850 nearly
    character-level ones), so every prompt row is ~40 % shorter."""
    from cua_native.gym.sim.tasks import catalogue
    from cua_native.models.tiny import default_corpus
    from cua_native.prompts.config import VARIANTS, PromptConfig
    from cua_native.prompts.families import FAMILIES

    prompts: list[str] = []
    for family in FAMILIES.values():
        for variant in VARIANTS[family.name]:
            config = PromptConfig(family=family.name, variant=variant)
            try:
                prompts.append(family.system_prompt(config))
            except ValueError:  # a variant that needs a screenshot to render
                continue
    instructions = [task.instruction for task in catalogue()]
    return default_corpus() + prompts * 4 + instructions


def tiny_model_dir(cache_dir: str | Path | None = None) -> Path:
    """Build the tiny Qwen3-VL under ``cache_dir`` unless a complete copy is already there.

    The directory's name carries a hash of the model's spec and tokenizer corpus, so a changed
    build never reuses a stale copy. The build goes to a temporary sibling and is renamed into
    place, so a crash or a concurrent builder never leaves a half-written model behind.
    """
    import hashlib
    import json

    from cua_native.models.tiny import TinySpec, build_tiny_qwen3_vl

    spec, corpus = TinySpec(), tokenizer_corpus()
    described = json.dumps({"spec": repr(spec), "corpus": corpus}, sort_keys=True)
    name = f"{TINY_MODEL_DIRNAME}-{hashlib.sha256(described.encode()).hexdigest()[:12]}"
    root = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    target = root / name
    if (target / _READY_MARKER).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    scratch = root / f".{name}.{os.getpid()}"
    build_tiny_qwen3_vl(scratch, spec, corpus)
    try:
        scratch.rename(target)
    except OSError:
        if not (target / _READY_MARKER).is_file():
            raise
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    return target


def resolve_model_path(path: str | None, cache_dir: str | Path | None = None) -> Path:
    """``path`` if given (must exist), else the cached tiny model."""
    if path is None:
        return tiny_model_dir(cache_dir)
    resolved = Path(path)
    if not (resolved / "config.json").is_file():
        raise ValueError(f"model path {path!r} is not a model directory (no config.json)")
    return resolved


def make_gym(config: GymConfig) -> Gym:
    """The gym a ``GymConfig`` names: the embedded simulator, a gym server over HTTP, or that
    server's devices driven over ADB, or real desktops (OSWorld's desktop-server API)."""
    if config.kind == "sim":
        from cua_native.gym.sim import SimGym

        return SimGym(seed=config.seed, **config.options)
    if config.kind == "desktop":
        from cua_native.gym.desktop.gym import DesktopGym

        gym_id = "desktop" if config.gym_id == "sim" else config.gym_id
        return DesktopGym(gym_id=gym_id, **config.options)
    if not config.base_url:
        raise ValueError(f"gym.kind '{config.kind}' needs gym.base_url")
    from cua_native.gym.http import HttpGym

    options = dict(config.options)
    if config.allowed_media_domains:
        options.setdefault("allowed_media_domains", tuple(config.allowed_media_domains))
    server = HttpGym(config.base_url, config.gym_id, **options)
    if config.kind == "http":
        return server
    from cua_native.gym.adb import AdbGym

    adb = config.adb
    return AdbGym(
        server,
        adb_host=adb.host,
        adb_port=adb.port,
        app_packages=dict(adb.app_packages),
        adb_keyboard=adb.keyboard,
    )


def model_dtype(model_path: str | Path) -> Any:
    """The dtype the model's ``config.json`` declares (``dtype`` or ``torch_dtype``), as a
    ``torch.dtype``; ``None`` when it declares none."""
    import json

    import torch

    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = (
        config.get("dtype")
        or config.get("torch_dtype")
        or (config.get("text_config") or {}).get("dtype")
    )
    value = getattr(torch, str(text), None) if text else None
    return value if isinstance(value, torch.dtype) else None


def load_processor(model_path: str | Path) -> Any:
    """The model's HF processor (blocking: call it in a thread)."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(model_path))


def stop_token_ids(tokenizer: Any) -> list[int]:
    """End-of-turn ids: EOS and ``<|im_end|>`` (Qwen chat models end a turn with it)."""
    ids = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if im_end is not None and im_end != getattr(tokenizer, "unk_token_id", None):
        ids.add(im_end)
    return sorted(int(i) for i in ids if i is not None)


MEDIA_TIMEOUT_S = 10.0
"""Connect/read/write/pool timeout of the prompt builder's screenshot fetches (the whole fetch,
redirects included, also runs under the builder's own deadline)."""


def media_client(config: GymConfig) -> httpx.AsyncClient | None:
    """The prompt builder's HTTP client for screenshot URLs (presigned object-store links), or
    ``None`` when ``allowed_media_domains`` is empty (every URL is refused then, before any
    fetch). Redirects are never followed by httpx: ``gym.media.fetch_image_url`` re-checks each
    hop against the allow-list and the private-address rule. The caller closes it."""
    if not config.allowed_media_domains:
        return None
    import httpx

    return httpx.AsyncClient(timeout=httpx.Timeout(MEDIA_TIMEOUT_S), follow_redirects=False)


def make_agent(
    config: AgentConfig,
    processor: Any,
    *,
    executor: Executor | None = None,
    http: httpx.AsyncClient | None = None,
) -> Agent:
    """The agent of ``config.family``: prompt builder, dialect and sampling settings. The dialect is the
    one the prompt teaches (same coordinate grid) unless ``config.dialect`` overrides it.
    ``http`` (``media_client``) fetches screenshot URLs from ``config.gym.allowed_media_domains``
    (the run's one allow-list), under ``gym.media``'s SSRF rules."""
    from cua_native.prompts import PromptBuilder, default_prompt_config, dialect_for

    tokenizer = processor.tokenizer
    prompt_config = default_prompt_config(config.family, **config.prompt)
    dialect = (
        get_dialect(config.family, **config.dialect)
        if config.dialect
        else dialect_for(prompt_config)
    )
    builder = PromptBuilder(
        prompt_config,
        processor,
        executor=executor,
        http=http,
        allowed_media_domains=tuple(config.gym.allowed_media_domains),
        dialect=dialect,
        encode_images=config.encode_images,
    )
    return Agent(
        builder=builder,
        dialect=dialect,
        tokenizer=tokenizer,
        gconfig=config.sampling.to_gconfig(stop_token_ids(tokenizer)),
        config=config,
    )


async def load_engine(model_path: str | Path, seed: int = 0) -> Any:
    """The in-process transformers engine on CPU (loaded in a thread)."""
    from cua_native.engine import InProcessEngine

    return await asyncio.to_thread(
        functools.partial(InProcessEngine.from_pretrained, str(model_path), device="cpu", seed=seed)
    )
