"""Episodes → AReaL training tensors, with per-episode reward normalisation.

Format (chosen for AReaL 1.0.4). One training row per TURN, in the tensor-dict form that
``VisionRLVRWorkflow`` returns and that ``concat_padded_tensors`` / ``concat_batch`` /
``FSDPEngine._prepare_mb_list`` consume: ``input_ids`` (prompt ids the engine consumed + output
ids), ``loss_mask`` (0 prompt, 1 output), ``logprobs`` (0 prompt, engine logprobs),
``versions`` (-1 prompt, engine versions), ``attention_mask``, ``mm_token_type_ids`` (1 on image
pads, 2 on video pads: the Qwen-VL position-id path requires it), ``rewards`` ([1] per row) and
``multi_modal_input`` (one ``{pixel_values, image_grid_thw}`` dict per row, all images of that
turn's prompt). The interaction form (``InteractionWithTokenLogpReward``) is not used: its
``to_tensor_dict`` carries no pixel tensors, so multi-image VLM turns cannot be trained from it.
A group's rows are concatenated into one padded dict (``[rows, max_len]``), as
``GroupedRolloutWorkflow`` does.

Rewards. AReaL's ``reward_norm`` with ``mean_level="group"`` slices the batch into fixed runs of
``group_size`` ROWS; with one row per turn and a different number of turns per episode those
slices cut across episodes. So normalisation happens here, per EPISODE: every episode of a group
gets ``A = (R - mean(R)) / (std(R) + eps)`` (unbiased std, AReaL's default), then turn ``t`` of
``T`` gets ``gamma ** (T - 1 - t) * A``. Train with ``actor.reward_norm: null`` (token-level
``adv_norm`` is unaffected). ``group_reward_norm=False`` keeps the raw discounted ``R``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from areal.utils.data import concat_padded_tensors

from cua_native.prompts.pixels import PromptPixels
from cua_native.prompts.token_types import mm_token_type_ids
from cua_native.rollout.config import CreditConfig
from cua_native.rollout.credit import anchor_advantages, tree_advantages
from cua_native.rollout.credit import normalized_rewards as normalized_rewards
from cua_native.rollout.episode import EpisodeRun
from cua_native.rollout.pixel_palette import COMPACT_KEYS, compact, is_compact
from cua_native.rollout.records import TurnRecord


@dataclass(frozen=True, slots=True)
class VisionTokens:
    """Ids of the placeholder tokens that ``mm_token_type_ids`` marks."""

    image_pad: int
    video_pad: int | None = None

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> VisionTokens:
        image = tokenizer.convert_tokens_to_ids("<|image_pad|>")
        video = tokenizer.convert_tokens_to_ids("<|video_pad|>")
        unk = getattr(tokenizer, "unk_token_id", None)
        if image is None or image == unk:
            raise ValueError("the tokenizer has no <|image_pad|> token: not a Qwen-VL model")
        return cls(image_pad=int(image), video_pad=None if video in (None, unk) else int(video))


UNIFORM_TOLERANCE = 1e-6
"""A normalised reward this close to 0 is 0: a mean of equal floats may differ from them in the
last bit (``0.1 * 3 / 3`` is not ``0.1``)."""


def is_uniform_group(rewards: Sequence[float], *, normalize: bool | str, eps: float) -> bool:
    """Whether a group is UNIFORM (the one name for a group without GRPO signal): after the
    group normalisation every episode's reward is 0 (its episodes all earned the same reward),
    so every row's reward is 0 and the update learns nothing from it. Without normalisation
    (``normalize=False``) the raw rewards still move the policy unless they are all 0. Decided
    from the episodes' rewards, before any row (with its pixels) is built."""
    values = (
        normalized_rewards(rewards, eps, divide_std=normalize != "mean")
        if normalize
        else list(rewards)
    )
    return all(abs(value) <= UNIFORM_TOLERANCE for value in values)


def discounted(value: float, turns: int, gamma: float) -> list[float]:
    """Turn ``t`` of ``turns`` gets ``gamma ** (turns - 1 - t) * value``."""
    return [gamma ** (turns - 1 - t) * value for t in range(turns)]


def attribute_rewards(
    runs: Sequence[EpisodeRun], *, gamma: float, normalize: bool | str, eps: float
) -> list[list[float]]:
    """Per-turn rewards of each episode; also written to ``TurnRecord.reward``. ``normalize``:
    ``True`` mean and std, ``"mean"`` the mean only, ``False`` raw rewards."""
    episode_rewards = [run.record.reward for run in runs]
    values = (
        normalized_rewards(episode_rewards, eps, divide_std=normalize != "mean")
        if normalize
        else episode_rewards
    )
    attributed: list[list[float]] = []
    for run, value in zip(runs, values, strict=True):
        per_turn = discounted(value, len(run.record.turns), gamma)
        for turn, reward in zip(run.record.turns, per_turn, strict=True):
            turn.reward = reward
        attributed.append(per_turn)
    return attributed


def sequence_row(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    multi_modal_input: Mapping[str, Any],
    tokens: VisionTokens,
) -> dict[str, Any]:
    """The row builder: one prompt + output sequence as a row (batch dimension 1) with what
    every trained row has: ``input_ids``, ``mm_token_type_ids`` (the prompt's placeholders;
    the output is text), ``loss_mask`` (1 on the output), ``attention_mask`` and the prompt's
    vision tensors. ``turn_sample`` adds the RL fields; SFT demonstrations use it as is."""
    prompt = np.asarray(prompt_ids, dtype=np.int64)
    n_prompt = len(prompt)
    seq = np.concatenate([prompt, np.asarray(output_ids, dtype=np.int64)])
    mm_types = torch.zeros((1, len(seq)), dtype=torch.long)
    mm_types[0, :n_prompt] = mm_token_type_ids(
        torch.from_numpy(prompt), tokens.image_pad, tokens.video_pad
    )
    loss_mask = np.zeros(len(seq), dtype=np.int32)
    loss_mask[n_prompt:] = 1
    return {
        "input_ids": _row(seq),
        "mm_token_type_ids": mm_types,
        "loss_mask": _row(loss_mask),
        "attention_mask": torch.ones((1, len(seq)), dtype=torch.bool),
        "multi_modal_input": [{k: v for k, v in multi_modal_input.items() if k in _MM_KEYS}],
    }


def turn_sample(
    turn: TurnRecord,
    multi_modal_input: dict[str, Any] | PromptPixels,
    reward: float,
    tokens: VisionTokens,
) -> dict[str, Any]:
    """One turn as an AReaL row (batch dimension 1): ``sequence_row`` plus the engine's
    ``logprobs`` and ``versions`` on the output (0 and -1 on the prompt) and the turn's
    ``rewards``."""
    if isinstance(multi_modal_input, PromptPixels):
        multi_modal_input = multi_modal_input.tensors()
    if not turn.output_ids:
        raise ValueError(f"turn {turn.index} has no output tokens")
    if "pixel_values" not in multi_modal_input and not is_compact(multi_modal_input):
        raise ValueError(f"turn {turn.index} has no pixel_values: every prompt holds a screenshot")
    sample = sequence_row(turn.prompt_ids, turn.output_ids, multi_modal_input, tokens)
    n_prompt, length = len(turn.prompt_ids), sample["input_ids"].shape[1]
    logprobs = np.zeros(length, dtype=np.float32)
    logprobs[n_prompt:] = turn.output_logprobs
    versions = np.full(length, -1, dtype=np.int32)
    versions[n_prompt:] = turn.output_versions
    sample["logprobs"] = _row(logprobs)
    sample["versions"] = _row(versions)
    sample["rewards"] = torch.tensor([reward], dtype=torch.float32)
    return sample


_MM_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "video_grid_thw",
    "pixel_values_videos",
    *COMPACT_KEYS,
)


def _row(values: np.ndarray) -> torch.Tensor:
    """A ``(1, L)`` tensor sharing the array's memory."""
    return torch.from_numpy(values).reshape(1, -1)


def episode_multi_modal_inputs(
    pixels: Sequence[PromptPixels],
    dtype: torch.dtype | None = None,
    compact_pixels: bool = False,
) -> list[dict[str, torch.Tensor]]:
    """Each turn's ``multi_modal_input`` with every distinct screenshot of the episode stored
    once, in ``dtype`` (the model's; ``None`` keeps the processor's float32).

    The episode's distinct images (the same ``ImageFeatures`` object is the same screenshot)
    are copied once into one tensor, in order of first use; a turn's ``pixel_values`` is then a
    view of the rows of its images, which a history window of the latest screenshots always
    finds consecutive. Only a turn whose images are not consecutive there gets its own copy.
    Without this every turn carried its whole window: 3 copies of each screenshot with a
    3-image history, in float32 (``bench/perf/rows.py``). ``compact_pixels``: the store is
    compacted once (``pixel_palette.compact``) and each turn's entry holds its rows' uint8
    indices and the palette instead of ``pixel_values`` (where the store cannot be compacted,
    the rows as they are)."""
    index: dict[int, int] = {}
    distinct: list[Any] = []
    for prompt in pixels:
        for feature in prompt.features if prompt.given is None else ():
            if id(feature) not in index:
                index[id(feature)] = len(distinct)
                distinct.append(feature)
    store: torch.Tensor | None = None
    bounds = [0]
    if distinct:
        first = distinct[0].pixel_values
        for feature in distinct:
            bounds.append(bounds[-1] + int(feature.pixel_values.shape[0]))
        store = torch.empty(
            (bounds[-1], first.shape[1]), dtype=dtype or first.dtype, device=first.device
        )
        for i, feature in enumerate(distinct):
            store[bounds[i] : bounds[i + 1]].copy_(feature.pixel_values)
    packed = compact(store) if compact_pixels and store is not None else None
    out: list[dict[str, torch.Tensor]] = []
    for prompt in pixels:
        if prompt.given is not None or not prompt.features:
            tensors = prompt.tensors()
            if dtype is not None and "pixel_values" in tensors:
                tensors["pixel_values"] = tensors["pixel_values"].to(dtype)
            out.append(tensors)
            continue
        assert store is not None
        ids = [index[id(f)] for f in prompt.features]
        source = store if packed is None else packed["pixel_indices"]
        if ids == list(range(ids[0], ids[0] + len(ids))):
            values = source[bounds[ids[0]] : bounds[ids[-1] + 1]]
        else:
            values = torch.cat([source[bounds[i] : bounds[i + 1]] for i in ids])
        grids = [f.image_grid_thw for f in prompt.features]
        entry = {"image_grid_thw": grids[0] if len(grids) == 1 else torch.cat(grids)}
        if packed is None:
            entry["pixel_values"] = values
        else:
            entry |= {"pixel_indices": values, **{k: packed[k] for k in COMPACT_KEYS[1:]}}
        out.append(entry)
    return out


def credit_rewards(
    runs: Sequence[EpisodeRun],
    *,
    gamma: float,
    normalize: bool | str,
    eps: float,
    credit: CreditConfig,
) -> tuple[list[list[float]], int]:
    """Per-turn advantages with the credit switches (``rollout/credit.py``): the tree of
    same-state siblings (the episode group when nothing branched) plus, with anchors on,
    ``anchor.weight`` × the anchor-state advantage; also written to ``TurnRecord.reward``.
    Returns them and the number of anchor groups that had two or more turns."""
    records = [run.record for run in runs]
    values = tree_advantages(records, gamma=gamma, normalize=normalize, eps=eps)
    shared = 0
    if credit.anchor.enabled:
        steps, shared = anchor_advantages(records, gamma=gamma, normalize=normalize, eps=eps)
        values = [
            [a + credit.anchor.weight * b for a, b in zip(va, vb, strict=True)]
            for va, vb in zip(values, steps, strict=True)
        ]
    for record, per_turn in zip(records, values, strict=True):
        for turn, reward in zip(record.turns, per_turn, strict=True):
            turn.reward = reward
    return values, shared


def group_samples(
    runs: Sequence[EpisodeRun],
    tokens: VisionTokens,
    *,
    gamma: float,
    normalize: bool | str,
    eps: float,
    pixel_dtype: torch.dtype | None = None,
    rewards: Sequence[Sequence[float]] | None = None,
    compact_pixels: bool = False,
) -> dict[str, Any] | None:
    """All turns of a group's completed episodes as one padded AReaL tensor dict; each
    episode's screenshots stored once (``episode_multi_modal_inputs``) in ``pixel_dtype``.
    Each row's reward is its turn's entry of ``rewards`` (``credit_rewards``' per-turn
    advantages) when given, else ``attribute_rewards``'. ``compact_pixels``: the screenshots
    as palette indices (``pixel_palette``; for rows that leave the process)."""
    attributed = (
        rewards
        if rewards is not None
        else attribute_rewards(runs, gamma=gamma, normalize=normalize, eps=eps)
    )
    rows = [
        turn_sample(turn, mm, reward, tokens)
        for run, rewards in zip(runs, attributed, strict=True)
        for turn, mm, reward in zip(
            run.record.turns,
            episode_multi_modal_inputs(run.prompt_pixels, pixel_dtype, compact_pixels),
            rewards,
            strict=True,
        )
    ]
    if not rows:
        return None
    padded: dict[str, Any] = concat_padded_tensors(rows)
    return padded
