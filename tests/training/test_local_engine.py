"""``LocalTrainEngine`` under AReaL's own ``PPOActor``: recomputed log-probs equal the
generator's, and a GRPO update moves the weights in the direction of the advantages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from areal.api.cli_args import PPOActorConfig
from areal.api.io_struct import SaveLoadMeta
from areal.trainer.ppo.actor import PPOActor
from areal.utils.data import concat_padded_tensors
from PIL import Image
from transformers import AutoModelForImageTextToText

from cua_native.training.local_engine import LocalTrainEngine


def _sample(model: Any, processor: Any, text: str, reward: float, seed: int) -> dict[str, Any]:
    image = Image.new("RGB", (320, 640), (40 * seed % 255, 120, 200))
    messages = [{"role": "user", "content": [{"type": "text", "text": text}, {"type": "image"}]}]
    prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = processor(text=[prompt], images=[image], return_tensors="pt")
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=8,
            do_sample=True,
            output_logits=True,
            return_dict_in_generate=True,
            suppress_tokens=[processor.image_token_id],
        )
    n_prompt = inputs["input_ids"].shape[1]
    new = out.sequences[0, n_prompt:]
    logprobs = [
        torch.log_softmax(lg[0].float(), -1)[t].item()
        for lg, t in zip(out.logits, new, strict=True)
    ]
    n = len(new)
    return {
        "input_ids": out.sequences,
        "attention_mask": torch.ones_like(out.sequences, dtype=torch.bool),
        "loss_mask": torch.tensor([[0] * n_prompt + [1] * n], dtype=torch.int32),
        "logprobs": torch.tensor([[0.0] * n_prompt + logprobs]),
        "versions": torch.tensor([[-1] * n_prompt + [0] * n], dtype=torch.int32),
        "mm_token_type_ids": torch.cat(
            [inputs["mm_token_type_ids"][0], torch.zeros(n, dtype=torch.long)]
        )[None],
        "multi_modal_input": [
            {"pixel_values": inputs["pixel_values"], "image_grid_thw": inputs["image_grid_thw"]}
        ],
        "rewards": torch.tensor([reward]),
    }


@pytest.fixture
def batch(tiny_dir: Path, processor: Any) -> list[dict[str, Any]]:
    generator = AutoModelForImageTextToText.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    group = [
        _sample(generator, processor, "Open Settings", 1.0, 1),
        _sample(generator, processor, "Go home", -1.0, 2),
    ]
    return [
        concat_padded_tensors(group),
        concat_padded_tensors([_sample(generator, processor, "x", 0.5, 3)]),
    ]


@pytest.mark.slow
def test_areal_ppo_actor_runs_on_the_local_engine(
    tiny_dir: Path, processor: Any, batch: list[dict[str, Any]], tmp_path: Path
) -> None:
    model = AutoModelForImageTextToText.from_pretrained(tiny_dir, dtype=torch.float32)
    engine = LocalTrainEngine(model, lr=1e-3, processor=processor)
    config = PPOActorConfig(
        experiment_name="t",
        trial_name="t",
        path=str(tiny_dir),
        backend="fsdp:d1",
        ppo_n_minibatches=1,
        recompute_logprob=True,
        use_decoupled_loss=False,
        adv_norm=None,
        reward_norm=None,
        kl_ctl=0.0,
    )
    actor = PPOActor(config, engine)

    recomputed = actor.compute_logp(batch)
    for traj, logp in zip(batch, recomputed, strict=True):
        mask = traj["loss_mask"].bool()
        # AReaL's convention: position t holds the log-prob of token t+1.
        assert torch.allclose(logp[torch.roll(mask, -1, -1)], traj["logprobs"][mask], atol=1e-4)
        traj["prox_logp"] = logp

    advantages = actor.compute_advantages(batch)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    actor.ppo_update(advantages)
    moved = [k for k, v in model.state_dict().items() if not torch.equal(before[k], v)]
    assert len(moved) > len(before) // 2

    # The update raises the log-prob of the rewarded sample's tokens and lowers the penalised one's.
    after = actor.compute_logp(batch)
    first = batch[0]
    mask = torch.roll(first["loss_mask"].bool(), -1, -1)
    delta = (after[0] - recomputed[0]) * mask
    assert delta[0].sum() > 0 > delta[1].sum()

    engine.set_version(3)
    engine.save(SaveLoadMeta(path=str(tmp_path / "ckpt"), weight_format="hf", with_optim=True))
    again = LocalTrainEngine(
        AutoModelForImageTextToText.from_pretrained(tiny_dir, dtype=torch.float32)
    )
    again.load(SaveLoadMeta(path=str(tmp_path / "ckpt"), weight_format="hf", with_optim=True))
    assert again.get_version() == 3
    assert all(torch.equal(v, again.model.state_dict()[k]) for k, v in model.state_dict().items())


def test_optimizer_type_follows_areal_config() -> None:
    model = torch.nn.Linear(3, 2)
    sgd = LocalTrainEngine(model, lr=0.5, optimizer="sgd", grad_clip=100.0)
    assert isinstance(sgd.optimizer, torch.optim.SGD)
    adam = LocalTrainEngine(
        model, lr=1e-3, optimizer="adam", betas=(0.8, 0.9), eps=1e-6, grad_clip=100.0
    )
    assert isinstance(adam.optimizer, torch.optim.AdamW)
    assert adam.optimizer.param_groups[0]["betas"] == (0.8, 0.9)
    assert adam.optimizer.param_groups[0]["eps"] == 1e-6
    # SGD moves a weight in proportion to its gradient; Adam's first step moves it by ~lr.
    x = torch.tensor([[1.0, 1e-3, 0.0]])
    for engine, expected in ((sgd, [0.5, 5e-4, 0.0]), (adam, [1e-3, 1e-3, 0.0])):
        engine.model.weight.data.zero_()
        engine.optimizer_zero_grad()
        engine.model(x)[0, 0].backward()
        engine.optimizer_step()
        moved = -engine.model.weight.data[0]
        assert moved.tolist() == pytest.approx(expected, rel=1e-2, abs=1e-7)
    with pytest.raises(ValueError, match="optimizer type"):
        LocalTrainEngine(model, optimizer="lion")


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("constant", [1.0, 1.0, 1.0, 1.0]),
        ("linear", [1.0, 0.75, 0.5, 0.25]),
        # half a cosine from lr to min_lr_ratio * lr
        ("cosine", [1.0, 0.8535534, 0.5, 0.1464466]),
    ],
)
def test_lr_schedule_follows_areal_config(kind: str, expected: list[float]) -> None:
    engine = LocalTrainEngine(torch.nn.Linear(3, 2), lr=2e-3)
    engine.schedule_lr(kind, 4)
    seen = []
    for _ in range(4):
        seen.append(engine.optimizer.param_groups[0]["lr"] / 2e-3)
        engine.optimizer_step()
        engine.lr_scheduler_step()
    assert seen == pytest.approx(expected, abs=1e-6)


def test_lr_schedule_warms_up_and_keeps_a_floor() -> None:
    engine = LocalTrainEngine(torch.nn.Linear(3, 2), lr=1.0)
    engine.schedule_lr("cosine", 10, warmup_proportion=0.2, min_lr_ratio=0.1)
    seen = []
    for _ in range(10):
        seen.append(engine.optimizer.param_groups[0]["lr"])
        engine.optimizer_step()
        engine.lr_scheduler_step()
    assert seen[:3] == pytest.approx([0.1, 0.55, 1.0])
    assert min(seen) >= 0.1 and seen[-1] < 0.2
    with pytest.raises(ValueError, match="lr_scheduler_type"):
        engine.schedule_lr("step", 10)


def test_without_a_schedule_the_rate_stays() -> None:
    engine = LocalTrainEngine(torch.nn.Linear(3, 2), lr=0.3)
    for _ in range(3):
        engine.lr_scheduler_step()
    assert engine.optimizer.param_groups[0]["lr"] == 0.3


def test_logits_only_where_the_loss_reads_them(
    tiny_dir: Path, processor: Any, batch: list[dict[str, Any]]
) -> None:
    """The head runs on the positions around output tokens only; log-probs, the GRPO loss and
    its gradient equal the full computation's, with the mask as collected (log-prob
    recomputation) and as ``compute_advantages`` rolls it (the update)."""
    from areal.trainer.ppo.actor import grpo_loss_fn

    model = AutoModelForImageTextToText.from_pretrained(tiny_dir, dtype=torch.float32)
    engine = LocalTrainEngine(model, processor=processor)
    rows = engine._rows(batch[0])
    for row in rows:
        reads = torch.roll(row["loss_mask"].bool(), -1, -1)  # t predicts output token t + 1
        logits, keep = engine._logits(row)
        assert keep is not None and logits.shape[0] < reads.shape[0] // 10
        kept, _ = engine._logprobs_entropy(row, logits, keep)
        full, _ = engine._logprobs_entropy(row, *engine._logits(row, every_position=True))
        assert torch.allclose(kept[reads], full[reads], atol=1e-5)

    def update_loss(use_keep: bool) -> tuple[float, list[torch.Tensor]]:
        row = dict(rows[0])
        rolled = torch.roll(row["loss_mask"], -1, -1)  # what compute_advantages stores
        row["loss_mask"] = rolled
        row["logprobs"] = torch.roll(row["logprobs"], -1, -1) * rolled
        row["prox_logp"] = row["logprobs"]
        row["advantages"] = torch.linspace(-1.0, 1.0, rolled.shape[0]) * rolled
        engine.optimizer_zero_grad()
        logits, keep = engine._logits(row, every_position=not use_keep)
        logprobs, entropy = engine._logprobs_entropy(row, logits, keep)
        loss = grpo_loss_fn(logprobs, entropy, row, eps_clip=0.2, eps_clip_higher=None, c_clip=None)
        loss.backward()
        return float(loss), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    kept_loss, kept_grads = update_loss(True)
    full_loss, full_grads = update_loss(False)
    assert kept_loss == pytest.approx(full_loss, abs=1e-6) and kept_loss != 0.0
    assert len(kept_grads) == len(full_grads)
    for a, b in zip(kept_grads, full_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_the_group_size_is_the_workflows_alone() -> None:
    """AReaL's rollouts per item stay 1: ``cua.agent.group_size`` is the one group size."""
    engine = LocalTrainEngine(torch.nn.Linear(3, 2))
    with pytest.raises(ValueError, match=r"cua\.agent\.group_size"):
        engine.rollout_batch([{"task": "{}"}], workflow=None, group_size=4)
