"""Episodes → slime ``Sample``s (slime's own class, vendored at the pinned commit), field by
field, on a group whose episodes earned different rewards: the per-turn rewards are the AReaL
path's (normalised within the group, discounted by turn); the buffer's items rebuild the same
samples on slime's side, tensors bit for bit; slime's own checks accept them."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import torch
from PIL import Image

from cua_native.actions.errors import ParsedOutput
from cua_native.actions.models import Click
from cua_native.gym.protocol import Observation, Screenshot, Task
from cua_native.prompts.pixels import PromptPixels
from cua_native.rollout.episode import EpisodeRun
from cua_native.rollout.records import EpisodeContext, EpisodeRecord, TurnRecord
from cua_native.rollout.trajectory import normalized_rewards
from cua_native.slime.buffer_client import exact_groups
from cua_native.slime.samples import group_turn_samples, record_for


def _run(reward: float, turns: int, seed: int) -> EpisodeRun:
    generator = torch.Generator().manual_seed(seed)
    context = EpisodeContext(task=Task(task_id="sim-001", instruction="Open Settings"))
    record = EpisodeRecord(context=context, reward=reward)
    for t in range(turns):
        record.turns.append(
            TurnRecord(
                index=t,
                observation=Observation(Screenshot(image=Image.new("RGB", (4, 4))), 4, 4, t),
                prompt_ids=[1, 7, 7, 7, 7, 2, 3 + t],
                output_ids=[10 + t, 11, 12],
                output_logprobs=[-0.5, -0.25, -0.125],
                output_versions=[2, 2, 2] if t else [1, 1, 1],
                text=f"answer {t}",
                parsed=ParsedOutput(action=Click(x=0.1, y=0.2)),
                stop_reason="length" if t == turns - 1 else "stop",
            )
        )
    pixels = [
        PromptPixels.of(
            {
                "pixel_values": torch.randn(16, 6, generator=generator),
                "image_grid_thw": torch.tensor([[1, 4, 4]]),
            }
        )
        for _ in range(turns)
    ]
    return EpisodeRun(record=record, prompt_pixels=pixels)


def test_group_samples_carry_the_loops_turns_and_rewards() -> None:
    from slime.observability.rollout_data_utils import validate_rollout_id_annotated
    from slime.utils.types import Sample

    runs = [_run(1.0, 2, 0), _run(0.0, 1, 1), _run(0.5, 3, 2)]
    templates = [
        SimpleNamespace(group_index=5, index=10 + i, prompt="p", label=None, metadata={"k": i})
        for i in range(3)
    ]
    samples = group_turn_samples(Sample, runs, templates, gamma=0.9, normalize=True, eps=1e-6)
    validate_rollout_id_annotated([samples])

    advantages = normalized_rewards([1.0, 0.0, 0.5], 1e-6)
    assert len({round(a, 6) for a in advantages}) == 3
    for run, template, advantage, episode in zip(runs, templates, advantages, samples, strict=True):
        turns = run.record.turns
        assert len(episode) == len(turns)
        for t, (turn, sample) in enumerate(zip(turns, episode, strict=True)):
            assert math.isclose(sample.reward, 0.9 ** (len(turns) - 1 - t) * advantage)
            assert sample.tokens == turn.prompt_ids + turn.output_ids
            assert sample.response_length == 3 and sample.loss_mask == [1, 1, 1]
            assert sample.rollout_log_probs == turn.output_logprobs
            assert sample.weight_versions == [str(turn.output_versions[0])]
            assert sample.status == (
                Sample.Status.TRUNCATED if t == len(turns) - 1 else Sample.Status.COMPLETED
            )
            assert (sample.index, sample.group_index, sample.rollout_id) == (
                template.index,
                5,
                template.index,
            )
            assert sample.metadata["k"] == template.metadata["k"]
            assert sample.metadata["raw_reward"] == run.record.reward
            mm = run.prompt_pixels[t].tensors()
            assert torch.equal(sample.multimodal_train_inputs["pixel_values"], mm["pixel_values"])
            assert torch.equal(
                sample.multimodal_train_inputs["image_grid_thw"], mm["image_grid_thw"]
            )
            sample._validate_response_metadata_lengths()

    # the buffer's items, through JSON and slime's Sample, give the same samples back
    rewards = [[s.reward for s in episode] for episode in samples]
    items = [
        json.loads(json.dumps(record_for(run, "sim-001", r[-1], r)))
        for run, r in zip(runs, rewards, strict=True)
    ]
    stock = [
        Sample(
            index=item["instance_id"],
            prompt=item["uid"],
            reward=item["reward"],
            metadata=item["extra_info"],
        )
        for item in items
    ]
    rebuilt = exact_groups(Sample, [stock])[0]
    validate_rollout_id_annotated([rebuilt])
    assert [e[0].rollout_id for e in rebuilt] == [0, 1, 2]
    for episode, again in zip(samples, rebuilt, strict=True):
        for a, b in zip(episode, again, strict=True):
            for name in (
                "tokens",
                "response_length",
                "loss_mask",
                "rollout_log_probs",
                "weight_versions",
                "status",
                "reward",
            ):
                assert getattr(a, name) == getattr(b, name), name
            for key, tensor in a.multimodal_train_inputs.items():
                assert torch.equal(tensor, b.multimodal_train_inputs[key])
                assert tensor.dtype == b.multimodal_train_inputs[key].dtype
