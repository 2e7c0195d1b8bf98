"""Load-time checks of the inference-server settings that keep behaviour tokens exact.

Each rule is a way a real server (not the stand-in) would generate from other ids or report
other log-probs than the trainer assumes; each gives one ``ConfigError`` naming the field,
before any worker, server or model starts. ``tests/conformance`` runs the servers' own code
behind every rule.

- **SGLang** builds a vision turn's ids itself: its multimodal processor decodes the ids the
  project sends (one pad per image, ``cua_native.engine.sglang_vision``) with the tokenizer of
  ``sglang.model_path`` and expands the pads with that directory's processor (both loaders,
  ``skip_tokenizer_init`` or not). ``sglang.model_path`` must therefore be ``actor.path``: any
  other tokenizer or processor builds other ids.
- **vLLM** reports raw log-probs (no temperature, no top-p/top-k) unless
  ``vllm.logprobs_mode`` is ``processed_logprobs``; a sampling setting that changes the
  distribution with another mode is refused, and so is a vLLM older than 0.10.0 (no such mode)
  where it is installed next to the launcher.
- Server versions this project runs the conformance tests on are ``SUPPORTED`` (the README
  says so); the known-bad combination above (vLLM < 0.10.0 with a changed distribution) is
  refused where the launcher can see the installed package.
"""

from __future__ import annotations

from importlib import metadata
from typing import NoReturn

from cua_native.config import ConfigError, LoadedConfig

SUPPORTED: dict[str, tuple[str, ...]] = {
    "sglang": ("0.5.10.post1", "0.5.23"),
    "vllm": ("0.19.1",),
}
"""Releases whose own request handling ``tests/conformance`` runs on every CI run."""

LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
"""vLLM's ``--logprobs-mode`` values (``vllm.config.model.LogprobsMode``)."""

VLLM_LOGPROBS_MODE_SINCE = (0, 10, 0)
"""The vLLM release that added ``--logprobs-mode`` (vllm-project/vllm PR #21398)."""


def _fail(field: str, message: str) -> NoReturn:
    raise ConfigError(f"config error: {field}: {message}")


def _release(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def installed_version(package: str) -> str | None:
    """The version of ``package`` installed next to the launcher, or ``None``."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def changes_distribution(loaded: LoadedConfig) -> bool:
    """Whether sampling differs from the model's plain softmax (temperature, top-p, top-k)."""
    sampling = loaded.cua.agent.sampling
    if sampling.greedy or sampling.temperature == 0:
        return False
    return sampling.temperature != 1.0 or sampling.top_p < 1.0 or sampling.top_k > 0


def check_sglang(loaded: LoadedConfig) -> None:
    model_path, actor_path = loaded.areal.sglang.model_path, loaded.areal.actor.path
    if model_path != actor_path:
        _fail(
            "sglang.model_path",
            f"must be actor.path ({actor_path!r}), got {model_path!r}: SGLang re-tokenizes each "
            "prompt and expands its images with this directory's tokenizer and processor",
        )


def check_vllm(loaded: LoadedConfig, vllm_version: str | None) -> None:
    mode = loaded.areal.vllm.logprobs_mode
    if mode not in LOGPROBS_MODES:
        _fail("vllm.logprobs_mode", f"must be one of {', '.join(LOGPROBS_MODES)} (got {mode!r})")
    if mode.endswith("_logits"):
        _fail(
            "vllm.logprobs_mode",
            f"must be processed_logprobs: {mode} reports logits, which AReaL would train on "
            "as log-probs",
        )
    if not changes_distribution(loaded):
        return
    sampling = loaded.cua.agent.sampling
    what = f"temperature {sampling.temperature}, top_p {sampling.top_p}, top_k {sampling.top_k}"
    if mode != "processed_logprobs":
        _fail(
            "vllm.logprobs_mode",
            f"must be processed_logprobs with cua.agent.sampling's {what}: {mode} reports "
            "log-probs of the raw logits, not of the distribution tokens are sampled from",
        )
    if vllm_version is not None and _release(vllm_version) < VLLM_LOGPROBS_MODE_SINCE:
        _fail(
            "rollout.backend",
            f"vLLM {vllm_version} is installed; it has no --logprobs-mode (0.10.0 added it) and "
            f"reports raw log-probs, wrong with cua.agent.sampling's {what}",
        )


def check_server_settings(loaded: LoadedConfig) -> None:
    """The rules above for the config's rollout backend."""
    backend = loaded.areal.rollout.backend.split(":", 1)[0]
    if backend == "sglang":
        check_sglang(loaded)
    elif backend == "vllm":
        check_vllm(loaded, installed_version("vllm"))
