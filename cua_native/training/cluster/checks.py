"""Load-time checks of a cluster config (``cua.mode: areal``): each wrong setting gives one
``ConfigError`` naming the field, before any worker, server or model is started.

Every rule below is a way AReaL 1.0.4's ``PPOTrainer`` fails or trains wrongly when the field is
left at AReaL's default (``docs/contracts.md#the-cluster-path``):

- ``scheduler.type`` unset: the single-controller trainer cannot start its workers;
- ``rollout.consumer_batch_size`` below ``train_dataset.batch_size``: the staleness manager
  admits ``(max_head_offpolicyness + version + 1) * consumer_batch_size`` groups, fewer than a
  step needs, and step 0 waits forever;
- ``rollout.experiment_name``/``trial_name`` unset: attaching to running servers and disk weight
  updates find nothing;
- ``max_head_offpolicyness > 0`` without ``actor.use_decoupled_loss``: stale samples are
  trained as if on-policy;
- packed micro-batches with an attention implementation that does not separate packed
  sequences (only flash attention's varlen path does): handled by the CUA actor, which then
  puts one sequence in each micro-batch (``packs_sequences``);
- ``cua.agent.prompt.max_pixels`` unset or above the model processor's budget: the server
  resizes the image again and the prompt ids drift from the trainer's;
- the inference server's own settings (``cua_native.training.cluster.server_checks``).

With the Ray or Slurm scheduler the rules of ``cua_native.training.cluster.multinode`` follow (what must
be reachable from and shared by every node), unless the run is known to stay on one host; with
Slurm those of ``slurm_scheduler.check_slurm_specs`` (the container every role runs in).
"""

from __future__ import annotations

from typing import Any, NoReturn

from cua_native.config import ConfigError, LoadedConfig
from cua_native.training.cluster.multinode import check_multinode_config
from cua_native.training.cluster.server_checks import check_server_settings
from cua_native.training.cluster.slurm_scheduler import check_slurm_specs

SCHEDULERS = ("local", "ray", "slurm")
BACKENDS = ("sglang", "vllm")
WEIGHT_UPDATE_MODES = ("disk", "xccl")
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")
"""Attention implementations that keep packed sequences apart (``cu_seqlens``)."""


def backend_name(loaded: LoadedConfig) -> str:
    backend: str = loaded.areal.rollout.backend
    return backend.split(":", 1)[0]


def packs_sequences(attn_impl: str) -> bool:
    """Whether several sequences may share a micro-batch under ``attn_impl``: only varlen
    flash attention separates them; ``sdpa``/``eager`` would attend across the boundary."""
    return attn_impl in VARLEN_ATTENTION


def _fail(field: str, message: str) -> NoReturn:
    raise ConfigError(f"config error: {field}: {message}")


def check_cluster_config(loaded: LoadedConfig, *, one_host: bool = False) -> None:
    """All rules that need no model files; ``check_pixel_budget`` needs the processor.
    ``one_host``: the Ray or Slurm cluster is this one machine (a rehearsal), so the rules of
    spanning nodes (``multinode.check_multinode_config``) do not apply."""
    areal, cua = loaded.areal, loaded.cua
    if not areal.actor.path:
        _fail("actor.path", "must name the model to train (a local directory)")
    gym = cua.agent.gym
    if gym.kind != "desktop" and (gym.kind not in ("http", "adb") or not gym.base_url):
        _fail(
            "cua.agent.gym",
            "must be kind 'http' or 'adb' with a base_url, or 'desktop', in cua.mode 'areal'",
        )
    if areal.scheduler.type not in SCHEDULERS:
        _fail(
            "scheduler.type",
            f"must be one of {', '.join(SCHEDULERS)} (got {areal.scheduler.type!r}); "
            "AReaL's PPOTrainer starts its actor and rollout workers through it",
        )
    backend = backend_name(loaded)
    if backend not in BACKENDS:
        _fail(
            "rollout.backend",
            f"must start with 'sglang:' or 'vllm:' (got {areal.rollout.backend!r})",
        )
    if areal.actor.weight_update_mode not in WEIGHT_UPDATE_MODES:
        _fail(
            "actor.weight_update_mode",
            f"must be one of {', '.join(WEIGHT_UPDATE_MODES)} "
            f"(got {areal.actor.weight_update_mode!r})",
        )
    if areal.actor.optimizer is None:
        _fail(
            "actor.optimizer",
            "must be set (e.g. optimizer: {lr: 1.0e-6}); without it "
            "the FSDP actor has nothing to step",
        )
    batch = areal.train_dataset.batch_size
    if areal.rollout.consumer_batch_size != batch:
        _fail(
            "rollout.consumer_batch_size",
            f"must equal train_dataset.batch_size ({batch}), got "
            f"{areal.rollout.consumer_batch_size}: AReaL admits (max_head_offpolicyness + "
            "version + 1) x consumer_batch_size groups, so a smaller value stalls the first step",
        )
    for name in ("experiment_name", "trial_name"):
        got, want = getattr(areal.rollout, name), getattr(areal, name)
        if got != want:
            _fail(
                f"rollout.{name}",
                f"must equal {name} ({want!r}), got {got!r}: attaching to running inference "
                "servers and disk weight updates look servers up under these names",
            )
    if areal.rollout.max_head_offpolicyness > 0 and not areal.actor.use_decoupled_loss:
        _fail(
            "actor.use_decoupled_loss",
            f"must be true when rollout.max_head_offpolicyness is "
            f"{areal.rollout.max_head_offpolicyness} (> 0): samples generated by older weights "
            "are otherwise trained as on-policy",
        )
    if cua.agent.prompt.get("max_pixels") is None:
        _fail(
            "cua.agent.prompt.max_pixels",
            "must be set in a cluster config: every screenshot costs max_pixels / 1024 tokens "
            "and that many pixel rows in each training row",
        )
    gym_domains = list(cua.agent.gym.allowed_media_domains)
    vllm_domains = list(areal.vllm.allowed_media_domains)
    if backend == "vllm" and vllm_domains and vllm_domains != gym_domains:
        _fail(
            "vllm.allowed_media_domains",
            f"must equal cua.agent.gym.allowed_media_domains ({gym_domains}); leave it unset "
            "and the loader copies the gym's list",
        )
    check_server_settings(loaded)
    if not one_host:
        check_multinode_config(loaded)
    check_slurm_specs(loaded)


def pixel_budget(processor: Any) -> tuple[int, int]:
    """``(min_pixels, max_pixels)`` the model's image processor resizes into."""
    image_processor = getattr(processor, "image_processor", processor)
    size = getattr(image_processor, "size", None) or {}
    low = size.get("shortest_edge", getattr(image_processor, "min_pixels", None))
    high = size.get("longest_edge", getattr(image_processor, "max_pixels", None))
    if low is None or high is None:
        raise ConfigError(
            "config error: actor.path: the model's image processor has no pixel budget"
        )
    return int(low), int(high)


def check_pixel_budget(loaded: LoadedConfig, processor: Any) -> None:
    """``cua.agent.prompt.max_pixels`` must lie inside the processor's budget: a larger image
    is resized again by the inference server and its ids no longer match the prompt's."""
    low, high = pixel_budget(processor)
    prompt = loaded.cua.agent.prompt
    max_pixels = prompt.get("max_pixels")
    if max_pixels is None or not low <= int(max_pixels) <= high:
        _fail(
            "cua.agent.prompt.max_pixels",
            f"must lie within the model processor's budget [{low}, {high}] (got {max_pixels})",
        )
    min_pixels = prompt.get("min_pixels")
    if min_pixels is not None and not low <= int(min_pixels) <= int(max_pixels):
        _fail(
            "cua.agent.prompt.min_pixels",
            f"must lie within [{low}, {max_pixels}] (got {min_pixels})",
        )
