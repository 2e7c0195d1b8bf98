"""Per-turn rows, reward attribution and per-episode normalisation, fed to AReaL's own code."""

from __future__ import annotations

import math

import pytest
import torch
from areal.api.cli_args import NormConfig, PPOActorConfig
from areal.infra.workflow_executor import check_trajectory_format
from areal.trainer.ppo.actor import PPOActor
from areal.utils.data import concat_batch, split_batch
from PIL import Image

from cua_native.actions.errors import ParsedOutput, failure
from cua_native.actions.models import Click
from cua_native.gym.protocol import Observation, Screenshot, Task
from cua_native.prompts.pixels import PromptPixels
from cua_native.rollout.episode import EpisodeRun
from cua_native.rollout.records import EpisodeContext, EpisodeRecord, TurnRecord
from cua_native.rollout.trajectory import (
    VisionTokens,
    discounted,
    group_samples,
    normalized_rewards,
    sequence_row,
    turn_sample,
)

IMAGE_PAD = 7
TOKENS = VisionTokens(image_pad=IMAGE_PAD, video_pad=8)


def _turn(index: int, prompt_len: int, out_len: int, ok: bool = True) -> TurnRecord:
    obs = Observation(Screenshot(image=Image.new("RGB", (4, 4))), 4, 4, index)
    return TurnRecord(
        index=index,
        observation=obs,
        prompt_ids=[1, IMAGE_PAD, IMAGE_PAD] + [2] * (prompt_len - 3),
        output_ids=list(range(10, 10 + out_len)),
        output_logprobs=[-0.25] * out_len,
        output_versions=[3] * out_len,
        text="x",
        parsed=ParsedOutput(action=Click(x=0.1, y=0.2)) if ok else failure("format", "no call"),
    )


def _run(reward: float, turn_shapes: list[tuple[int, int]]) -> EpisodeRun:
    record = EpisodeRecord(context=EpisodeContext(task=Task(task_id="t")), reward=reward)
    record.turns = [_turn(i, p, o) for i, (p, o) in enumerate(turn_shapes)]
    mm = [
        PromptPixels.of(
            {"pixel_values": torch.randn(4, 6), "image_grid_thw": torch.tensor([[1, 2, 2]])}
        )
        for _ in turn_shapes
    ]
    return EpisodeRun(record=record, prompt_pixels=mm)


def test_discount_and_normalisation() -> None:
    assert discounted(1.0, 3, 0.5) == [0.25, 0.5, 1.0]
    values = normalized_rewards([1.0, 0.0, 0.0, 1.0], 1e-6)
    assert sum(values) == pytest.approx(0.0)
    std = math.sqrt(sum(v * v for v in values) / 3)
    assert std == pytest.approx(1.0, rel=1e-4)
    assert normalized_rewards([0.7], 1e-6) == [0.0]
    assert normalized_rewards([0.5, 0.5], 1e-6) == [0.0, 0.0]


def test_mean_only_normalisation_keeps_reward_differences_their_size() -> None:
    # A group that only differs by one format penalty: GRPO's std division turns it into
    # unit-size advantages; the mean-only form leaves it at the penalty's size.
    rewards = [0.0, 0.0, 0.0, -0.05]
    assert max(abs(v) for v in normalized_rewards(rewards, 1e-6)) > 1.0
    assert normalized_rewards(rewards, 1e-6, divide_std=False) == pytest.approx(
        [0.0125, 0.0125, 0.0125, -0.0375]
    )
    assert normalized_rewards([1.0], 1e-6, divide_std=False) == [0.0]


def test_turn_sample_layout() -> None:
    turn = _turn(0, 6, 3)
    mm = {"pixel_values": torch.ones(2, 3), "image_grid_thw": torch.tensor([[1, 1, 2]])}
    sample = turn_sample(turn, mm, 0.5, TOKENS)
    assert sample["input_ids"].tolist() == [turn.prompt_ids + turn.output_ids]
    assert sample["loss_mask"].tolist() == [[0] * 6 + [1] * 3]
    assert sample["logprobs"].tolist() == [[0.0] * 6 + [-0.25] * 3]
    assert sample["versions"].tolist() == [[-1] * 6 + [3] * 3]
    assert sample["mm_token_type_ids"].tolist() == [[0, 1, 1, 0, 0, 0, 0, 0, 0]]
    assert sample["rewards"].tolist() == [0.5]
    assert check_trajectory_format(sample)
    with pytest.raises(ValueError, match="pixel_values"):
        turn_sample(turn, {}, 0.0, TOKENS)


def test_turn_rows_extend_the_one_sequence_row() -> None:
    """Demonstrations use ``sequence_row`` as is; a turn's row is that row plus the RL fields.
    Placeholders are marked on the prompt only (a video pad 2, an image pad the model
    generated stays text)."""
    turn = _turn(0, 6, 3)
    turn.prompt_ids[4] = 8
    turn.output_ids[1] = IMAGE_PAD
    mm = {"pixel_values": torch.ones(2, 3), "image_grid_thw": torch.tensor([[1, 1, 2]]), "x": 1}
    base = sequence_row(turn.prompt_ids, turn.output_ids, mm, TOKENS)
    sample = turn_sample(turn, mm, 0.5, TOKENS)
    assert set(sample) - set(base) == {"logprobs", "versions", "rewards"}
    for key in ("input_ids", "mm_token_type_ids", "loss_mask", "attention_mask"):
        assert torch.equal(sample[key], base[key]), key
    assert base["mm_token_type_ids"].tolist() == [[0, 1, 1, 0, 2, 0, 0, 0, 0]]
    assert base["mm_token_type_ids"].dtype == base["input_ids"].dtype == torch.long
    assert base["multi_modal_input"] == [
        {"pixel_values": mm["pixel_values"], "image_grid_thw": mm["image_grid_thw"]}
    ]


def test_group_rows_are_per_turn_and_normalised_per_episode() -> None:
    # Episode A succeeds in 3 turns, B fails in 1 turn: 4 rows, but 2 episodes to normalise.
    runs = [_run(1.0, [(5, 2), (8, 3), (11, 2)]), _run(0.0, [(5, 4)])]
    out = group_samples(runs, TOKENS, gamma=0.5, normalize=True, eps=1e-6)
    assert out is not None
    assert check_trajectory_format(out)
    assert out["input_ids"].shape == (4, 13)
    assert len(out["multi_modal_input"]) == 4
    a = 0.5 / math.sqrt(0.5)  # (1 - 0.5) / unbiased std of [1, 0]
    assert out["rewards"].tolist() == pytest.approx([0.25 * a, 0.5 * a, a, -a], rel=1e-5)
    assert [t.reward for t in runs[0].record.turns] == pytest.approx(
        [0.25 * a, 0.5 * a, a], rel=1e-5
    )
    raw = group_samples(runs, TOKENS, gamma=1.0, normalize=False, eps=1e-6)
    assert raw is not None and raw["rewards"].tolist() == [1.0, 1.0, 1.0, 0.0]


def test_rows_go_through_areal_advantages() -> None:
    """The group's rows survive AReaL's batching and GRPO advantage code: every output token of
    the winning episode gets a positive advantage, every one of the losing episode a negative."""
    runs = [_run(1.0, [(5, 2), (8, 3)]), _run(0.0, [(6, 4)])]
    group = group_samples(runs, TOKENS, gamma=0.9, normalize=True, eps=1e-6)
    other = group_samples(
        [_run(0.0, [(5, 2)]), _run(1.0, [(7, 2), (9, 2), (9, 1)])],
        TOKENS,
        gamma=0.9,
        normalize=True,
        eps=1e-6,
    )
    assert group is not None and other is not None
    config = PPOActorConfig(
        path="unused",
        reward_norm=None,
        adv_norm=NormConfig(mean_level="batch", std_level="batch"),
        kl_ctl=0.0,
        discount=1.0,
        gae_lambda=1.0,
    )
    actor = PPOActor(config, engine=None)  # compute_advantages never touches the engine
    batched, meta = concat_batch([group, other])
    assert batched["input_ids"].shape[0] == 7 and len(batched["multi_modal_input"]) == 7
    result = split_batch(actor._compute_advantages(batched), meta)
    adv = result[0]["advantages"]
    mask = result[0]["loss_mask"].bool()
    assert (adv[:2][mask[:2]] > 0).all()
    assert (adv[2][mask[2]] < 0).all()
    assert result[1]["advantages"][0][result[1]["loss_mask"][0].bool()].lt(0).all()


def test_token_texts_match_hf_batch_decode(processor) -> None:
    from cua_native.rollout.agent import token_texts_of

    tokenizer = processor.tokenizer
    ids = tokenizer.encode('<tool_call>{"x": 1} héllo 你好</tool_call><|im_end|>')
    assert token_texts_of(tokenizer, ids) == tokenizer.batch_decode([[i] for i in ids])


def test_token_texts_keep_hf_cleanup_when_the_tokenizer_asks_for_it() -> None:
    from cua_native.rollout.agent import token_texts_of

    class Backend:
        def decode_batch(self, batch, skip_special_tokens=False):  # pragma: no cover
            raise AssertionError("the backend skips HF's space clean-up")

    class Tokenizer:
        backend_tokenizer = Backend()
        clean_up_tokenization_spaces = True

        def batch_decode(self, batch):
            return [f"<{ids[0]}>" for ids in batch]

    assert token_texts_of(Tokenizer(), [3, 4]) == ["<3>", "<4>"]


def test_token_texts_decode_each_id_once(processor) -> None:
    from cua_native.rollout.agent import TokenTexts, token_texts_of

    decoded: list[list[int]] = []

    class Counting:
        clean_up_tokenization_spaces = True  # HF's path, so batch_decode sees every miss

        def batch_decode(self, batch):
            decoded.extend(batch)
            return processor.tokenizer.batch_decode(batch)

    texts = TokenTexts(Counting())
    ids = processor.tokenizer.encode("héllo héllo <|im_end|> 你好")
    assert texts(ids) == token_texts_of(processor.tokenizer, ids)
    assert texts(ids[::-1]) == token_texts_of(processor.tokenizer, ids[::-1])
    assert sorted(i for [i] in decoded) == sorted(set(ids))
