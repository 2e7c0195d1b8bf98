"""Episodes → slime ``Sample``s: one sample per TURN, the episode's turns sharing a ``rollout_id``.

Why per turn (docs/slime.md): the prompt builders rebuild every turn's prompt (the screenshot
history keeps the latest images, older turns shrink to text), so turn ``t + 1``'s prompt is not
turn ``t``'s prompt plus its answer, and one sequence per episode would train on contexts the
model never saw. slime's trainer takes several samples of one rollout at the pinned commit: a
rollout function may return ``prompt × rollout × samples`` with the same ``Sample.rollout_id`` on
every sample of a rollout (``slime/observability/rollout_data_utils.py``,
``validate_rollout_id_annotated``); its loss averages per rollout (``rollout_mask_sums``) and its
steps hold ``--global-batch-size`` rollouts (``slime/ray/rollout.py``, ``_split_train_data_by_dp``).

A turn's sample, field by field (slime's ``slime/utils/types.py``): ``tokens`` = the prompt ids the
engine generated from + its output ids; ``response_length`` = the output's length; ``loss_mask``
= 1 on every output token; ``rollout_log_probs`` = the engine's; ``weight_versions`` = the
version of each answer that produced the output (one per HTTP answer kept, as slime appends
them); ``reward`` = the turn's reward as on the AReaL path (the episode's reward normalised
within its group, discounted by turn: ``rollout/trajectory.py``), ``metadata["raw_reward"]`` the
episode's reward; ``status`` ``truncated`` when the turn hit ``max_new_tokens``, else
``completed``; ``multimodal_train_inputs`` = the turn's ``pixel_values`` and ``image_grid_thw``
(every image of its prompt), the keys slime's own processor path gives its Megatron trainer.

The buffer's records (``record_for``) carry the same per turn in ``extra_info["cua"]``, tensors
as base64 (``encode_tensor``), and ``turn_samples_from_metadata`` rebuilds these samples from
them on slime's side. ``sample_cls`` is slime's ``Sample`` class, passed in: this package does
not import slime.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from cua_native.rollout.episode import EpisodeRun
from cua_native.rollout.records import TurnRecord
from cua_native.rollout.trajectory import attribute_rewards, episode_multi_modal_inputs

TRAIN_KEYS = ("pixel_values", "image_grid_thw")
"""What slime's trainer gets of a prompt's images (its processor output minus the ids)."""

CUA_KEY = "cua"
"""The buffer record's ``extra_info`` key holding the exact turns (a ``Sample.metadata`` key on
slime's side: slime's client copies ``extra_info`` into it)."""


def answer_versions(turn: TurnRecord) -> list[str]:
    """One version per answer that produced the turn's output (runs of equal token versions)."""
    out: list[str] = []
    previous: int | None = None
    for version in turn.output_versions:
        if version != previous:
            out.append(str(version))
            previous = version
    return out


def turn_status(sample_cls: Any, stop_reason: str | None) -> Any:
    return sample_cls.Status.TRUNCATED if stop_reason == "length" else sample_cls.Status.COMPLETED


def train_inputs(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The trainer's image tensors of one prompt, each its own copy (a view would take the
    episode's whole image store along when slime ships the sample)."""
    return {key: tensors[key].contiguous().clone() for key in TRAIN_KEYS if key in tensors}


def turn_fields(turn: TurnRecord, reward: float, mm: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A turn's ``Sample`` fields that come from the loop (not from slime's prompt sample)."""
    n = len(turn.output_ids)
    return {
        "tokens": [*turn.prompt_ids, *turn.output_ids],
        "response": turn.text,
        "response_length": n,
        "reward": float(reward),
        "loss_mask": [1] * n,
        "rollout_log_probs": [float(x) for x in turn.output_logprobs],
        "weight_versions": answer_versions(turn),
        "multimodal_train_inputs": train_inputs(mm) or None,
    }


def episode_metadata(run: EpisodeRun, turn: int) -> dict[str, Any]:
    record = run.record
    return {
        "raw_reward": float(record.reward),
        "cua_episode_id": record.context.episode_id,
        "cua_task_id": record.context.task.task_id,
        "cua_turn": turn,
        "cua_turns": len(record.turns),
        "cua_end_reason": str(record.end_reason),
        "cua_success": bool(record.success),
    }


def group_turn_samples(
    sample_cls: Any,
    runs: Sequence[EpisodeRun],
    templates: Sequence[Any],
    *,
    gamma: float,
    normalize: bool | str,
    eps: float,
) -> list[list[Any]]:
    """A completed group as slime samples: per episode (``templates[i]``, slime's prompt
    sample it played), its turns' samples. Every sample of an episode has the episode's
    ``index``, ``group_index`` and ``rollout_id = index``."""
    rewards = attribute_rewards(runs, gamma=gamma, normalize=normalize, eps=eps)
    out: list[list[Any]] = []
    for run, template, per_turn in zip(runs, templates, rewards, strict=True):
        images = episode_multi_modal_inputs(run.prompt_pixels)
        episode: list[Any] = []
        for turn, mm, reward in zip(run.record.turns, images, per_turn, strict=True):
            episode.append(
                sample_cls(
                    group_index=template.group_index,
                    index=template.index,
                    rollout_id=template.index,
                    prompt=template.prompt,
                    label=template.label,
                    status=turn_status(sample_cls, turn.stop_reason),
                    metadata={**(template.metadata or {}), **episode_metadata(run, turn.index)},
                    **turn_fields(turn, reward, mm),
                )
            )
        out.append(episode)
    return out


def encode_tensor(tensor: torch.Tensor) -> dict[str, Any]:
    """A tensor as JSON: dtype, shape and its bytes in base64."""
    array = tensor.detach().cpu().contiguous().numpy()
    return {
        "dtype": str(array.dtype),
        "shape": list(array.shape),
        "data": base64.b64encode(array.tobytes()).decode("ascii"),
    }


def decode_tensor(value: dict[str, Any]) -> torch.Tensor:
    """``encode_tensor``'s inverse."""
    raw = base64.b64decode(value["data"])
    array = np.frombuffer(raw, dtype=np.dtype(value["dtype"])).reshape(value["shape"])
    return torch.from_numpy(array.copy())


def episode_messages(run: EpisodeRun) -> list[dict[str, str]]:
    """The episode as text chat messages, for clients that re-tokenize text (slime's stock
    rollout-buffer client): the instruction, then each answer, a screenshot marker between.
    Never what is trained on when the exact turns are used."""
    record = run.record
    messages = [{"role": "user", "content": record.context.task.instruction}]
    for index, turn in enumerate(record.turns):
        if index:
            messages.append({"role": "user", "content": "[screenshot]"})
        messages.append({"role": "assistant", "content": turn.text})
    return messages


def record_for(
    run: EpisodeRun, instance_id: str, advantage: float, turn_rewards: Sequence[float]
) -> dict[str, Any]:
    """One episode as a rollout-buffer item (slime's required keys ``uid``, ``instance_id``,
    ``messages``, ``reward``, ``extra_info``): ``reward`` is the episode's normalised reward
    (``--disable-rewards-normalization`` on slime's side), the exact turns in
    ``extra_info["cua"]``."""
    record = run.record
    images = episode_multi_modal_inputs(run.prompt_pixels)
    turns = [
        {
            "prompt_ids": list(turn.prompt_ids),
            "output_ids": list(turn.output_ids),
            "output_logprobs": [float(x) for x in turn.output_logprobs],
            "output_versions": [int(v) for v in turn.output_versions],
            "stop_reason": turn.stop_reason,
            "text": turn.text,
            "reward": float(reward),
            "multimodal_train_inputs": {k: encode_tensor(v) for k, v in train_inputs(mm).items()},
        }
        for turn, mm, reward in zip(record.turns, images, turn_rewards, strict=True)
    ]
    last = record.turns[-1].stop_reason if record.turns else None
    return {
        "uid": record.context.episode_id,
        "instance_id": instance_id,
        "messages": episode_messages(run),
        "reward": float(advantage),
        "extra_info": {
            "timestamp": str(time.time()),
            "finish_reason": "length" if last == "length" else "stop",
            "round_number": len(record.turns),
            "raw_reward": float(record.reward),
            CUA_KEY: {**episode_metadata(run, 0), "turns": turns},
        },
    }


def turn_samples_from_metadata(sample_cls: Any, sample: Any, rollout_id: int) -> list[Any]:
    """The exact per-turn samples of one episode sample slime's stock rollout-buffer client
    built (its ``metadata`` is the record's ``extra_info``): ids, masks, log-probs, versions,
    rewards and image tensors from ``metadata["cua"]``; ``index`` and ``group_index`` kept
    (that client sets ``index`` to the group's ``instance_id``), ``rollout_id`` the episode's
    (unique in the batch: the client gives the episodes of a group one ``index``).

    ``ValueError`` when the sample carries no exact turns (it did not come from this buffer)."""
    exact = (sample.metadata or {}).get(CUA_KEY)
    if not isinstance(exact, dict) or not isinstance(exact.get("turns"), list):
        raise ValueError(f"sample {sample.index} carries no metadata['{CUA_KEY}'] turns")
    base = {k: v for k, v in sample.metadata.items() if k != CUA_KEY}
    base.update({k: v for k, v in exact.items() if k != "turns"})
    out = []
    for index, turn in enumerate(exact["turns"]):
        n = len(turn["output_ids"])
        versions: list[str] = []
        for version in turn["output_versions"]:
            if not versions or versions[-1] != str(version):
                versions.append(str(version))
        mm = {k: decode_tensor(v) for k, v in turn["multimodal_train_inputs"].items()}
        out.append(
            sample_cls(
                group_index=sample.group_index,
                index=sample.index,
                rollout_id=rollout_id,
                prompt=sample.prompt,
                tokens=[*turn["prompt_ids"], *turn["output_ids"]],
                response=turn["text"],
                response_length=n,
                reward=float(turn["reward"]),
                loss_mask=[1] * n,
                rollout_log_probs=[float(x) for x in turn["output_logprobs"]],
                weight_versions=versions,
                status=turn_status(sample_cls, turn["stop_reason"]),
                metadata={**base, "cua_turn": index},
                multimodal_train_inputs=mm or None,
            )
        )
    return out
