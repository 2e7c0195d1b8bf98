"""Warm start: demonstrations are exact SFT rows, AReaL's SFT loss goes down, the result loads."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from areal.api.io_struct import ModelRequest, ModelResponse
from transformers import AutoModelForImageTextToText, AutoProcessor

from cua_native.actions import models as m
from cua_native.config import WarmStart
from cua_native.prompts import default_prompt_config, dialect_for
from cua_native.rollout.dataset import TaskSource
from cua_native.training.warmstart.demos import (
    Demo,
    DemoSpec,
    collect_demos,
    reservoir_keeps,
    same_action,
    source_for,
)
from cua_native.training.warmstart.sft import (
    WARM_START_MARKER,
    batch_order,
    score_first_steps,
    train_sft,
    warm_start,
)

ALL = TaskSource(split="all")


def _demos(processor: Any, family: str, source: Any) -> list[Demo]:
    return collect_demos(processor, DemoSpec(family=family, tasks=ALL), source)


@pytest.fixture
def mai_demos(processor: Any, toy_source: Any) -> list[Demo]:
    return _demos(processor, "mai_ui", toy_source)


@pytest.mark.parametrize("family", ["mai_ui", "qwen3_vl"])
def test_demos_are_exact_sft_rows(processor: Any, family: str, toy_source: Any) -> None:
    demos = _demos(processor, family, toy_source)
    tokenizer = processor.tokenizer
    dialect = dialect_for(default_prompt_config(family))
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    image_pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert len(demos) == 16  # 8 tasks x (one move + terminate)
    assert not toy_source.gyms[0].live, "every execution is closed"
    for demo in demos:
        ids = demo.sample["input_ids"][0]
        mask = demo.sample["loss_mask"][0]
        assert ids.shape == mask.shape == demo.sample["attention_mask"][0].shape
        # the mask covers exactly the target: a contiguous tail after the prompt
        assert mask[: demo.prompt_length].sum() == 0
        assert bool(mask[demo.prompt_length :].all())
        target = ids[mask.bool()].tolist()
        assert target[-1] == stop and stop not in target[:-1]
        text = tokenizer.decode(target[:-1], skip_special_tokens=False)
        assert text == demo.text
        parsed = dialect.parse(text, image_size=demo.image_size)
        assert parsed.ok
        assert same_action(parsed.action, demo.action, dialect.coordinate_step(demo.image_size))
        types = demo.sample["mm_token_type_ids"][0]
        assert int((types == 1).sum()) == int((ids == image_pad).sum()) > 0
        mm = demo.sample["multi_modal_input"][0]
        assert set(mm) == {"pixel_values", "image_grid_thw"}
    by_task: dict[str, list[Demo]] = {}
    for demo in demos:
        by_task.setdefault(demo.task_id, []).append(demo)
    opening = by_task["toy-open-notes"]
    assert [type(d.action) for d in opening] == [m.Click, m.Terminate]
    assert "Tap Notes." in opening[0].text
    # the real history convention: the second prompt carries the first turn
    second_prompt = tokenizer.decode(opening[1].sample["input_ids"][0, : opening[1].prompt_length])
    history_hint = "Tap Notes." if family == "mai_ui" else "Step 1"
    assert history_hint in second_prompt and opening[1].prompt_length > opening[0].prompt_length


@pytest.mark.parametrize("family", ["mai_ui", "qwen3_vl"])
def test_goal_in_thought_restates_the_instruction(
    processor: Any, family: str, toy_source: Any
) -> None:
    tokenizer = processor.tokenizer
    dialect = dialect_for(default_prompt_config(family))
    spec = DemoSpec(family=family, tasks=ALL, goal_in_thought=True)
    with_goal = collect_demos(processor, spec, toy_source)
    plain = _demos(processor, family, toy_source)
    tasks = asyncio.run(toy_source.gyms[0].list_tasks())
    instructions = {t.task_id: t.instruction for t in tasks}
    assert len(with_goal) == len(plain)
    for goal, base in zip(with_goal, plain, strict=True):
        said = f"Goal: {instructions[goal.task_id].strip()} "
        assert said in goal.text and said not in base.text
        assert goal.text.replace(said, "") == base.text  # the same turn, the goal in front
        parsed = dialect.parse(goal.text, image_size=goal.image_size)
        step = dialect.coordinate_step(goal.image_size)
        assert parsed.ok and same_action(parsed.action, base.action, step)
        target = goal.sample["input_ids"][0][goal.sample["loss_mask"][0].bool()].tolist()
        assert tokenizer.decode(target[:-1], skip_special_tokens=False) == goal.text
        if parsed.summary is not None:  # Qwen's summary line, later the history: no goal
            assert "Goal:" not in parsed.summary
        if goal.step == 0:  # the first prompt is unchanged: only the written turn differs
            assert goal.prompt_length == base.prompt_length


def test_demos_are_deterministic(processor: Any, mai_demos: list[Demo], toy_source: Any) -> None:
    again = _demos(processor, "mai_ui", toy_source)
    assert [d.text for d in again] == [d.text for d in mai_demos]
    for a, b in zip(again, mai_demos, strict=True):
        assert torch.equal(a.sample["input_ids"], b.sample["input_ids"])
        assert torch.equal(
            a.sample["multi_modal_input"][0]["pixel_values"],
            b.sample["multi_modal_input"][0]["pixel_values"],
        )


def test_batch_order_is_seeded_and_covers_every_demo() -> None:
    order = batch_order(10, 4, 5, seed=3)
    assert order == batch_order(10, 4, 5, seed=3)
    assert order != batch_order(10, 4, 5, seed=4)
    assert all(len(b) == 4 and len(set(b)) == 4 for b in order)
    assert set(order[0] + order[1] + order[2][:2]) == set(range(10))
    assert [sorted(b) for b in batch_order(3, 8, 2, seed=0)] == [[0, 1, 2], [0, 1, 2]]


def test_sft_loss_decreases(tiny_dir: Path, mai_demos: list[Demo]) -> None:
    from cua_native.training.local_engine import LocalTrainEngine

    model = AutoModelForImageTextToText.from_pretrained(tiny_dir, dtype=torch.float32)
    engine = LocalTrainEngine(model, lr=2e-3)
    torch.manual_seed(0)
    with torch._dynamo.config.patch(disable=True):
        losses = train_sft(engine, mai_demos[:4], WarmStart(steps=6, batch_size=4))
    assert len(losses) == 6
    assert losses[-1] < losses[0] - 0.5, losses


def test_warm_start_saves_a_loadable_model_dir(
    tiny_dir: Path, tmp_path: Path, toy_source: Any
) -> None:
    out = tmp_path / "warm"
    report = warm_start(
        tiny_dir,
        out,
        WarmStart(steps=3, batch_size=2, lr=2e-3),
        "mai_ui",
        None,
        progress=False,
        tasks=TaskSource(split="all", task_ids=["toy-open-notes", "toy-home-from-clock"]),
        demo_source=toy_source,
    )
    assert report.steps == 3 and report.demos == 4 and report.tasks == 2
    assert report.last_loss < report.first_loss
    assert json.loads((out / WARM_START_MARKER).read_text())["steps"] == 3
    AutoProcessor.from_pretrained(out)
    loaded = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.float32)
    base = AutoModelForImageTextToText.from_pretrained(tiny_dir, dtype=torch.float32)
    changed = [
        name
        for (name, a), (_, b) in zip(
            loaded.state_dict().items(), base.state_dict().items(), strict=True
        )
        if not torch.equal(a, b)
    ]
    assert changed, "the saved weights are the trained ones"
    assert not list(tmp_path.glob(".warm.*")), "no scratch directory left behind"


class ReplayEngine:
    """A real ``agenerate`` that answers every prompt with fixed token ids (no model)."""

    def __init__(self, answers: dict[tuple[int, ...], list[int]]) -> None:
        self.answers = answers

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        output = self.answers[tuple(req.input_ids)]
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=output,
            output_logprobs=[0.0] * len(output),
            output_versions=[0] * len(output),
            stop_reason="stop",
        )


async def test_first_step_scores_count_parses_and_matches(
    processor: Any, mai_demos: list[Demo]
) -> None:
    tokenizer = processor.tokenizer
    dialect = dialect_for(default_prompt_config("mai_ui"))
    # distinct prompts only: the replay engine answers by prompt ids
    firsts = [d for d in mai_demos if d.step == 0 and d.task_id.startswith("toy-open-")]
    answers: dict[tuple[int, ...], list[int]] = {}
    for index, demo in enumerate(firsts):
        prompt = tuple(demo.sample["input_ids"][0, : demo.prompt_length].tolist())
        target = demo.sample["input_ids"][0, demo.prompt_length :].tolist()
        if index % 4 == 1:  # a wrong but well-formed action
            text = dialect.format(m.SystemButton(button="back"), thought="Go back.")
            target = tokenizer(text, add_special_tokens=False)["input_ids"] + target[-1:]
        elif index % 4 == 2:  # unparseable
            target = tokenizer("I am not sure.", add_special_tokens=False)["input_ids"]
        answers[prompt] = target
    engine = ReplayEngine(answers)
    score = await score_first_steps(engine, firsts, dialect, tokenizer, greedy=True)
    assert score.prompts == len(firsts) == 4
    assert score.parsed == 3 and score.matched == 2
    assert score.parse_rate == 0.75 and score.match_rate == 0.5
    assert [(t.task_id, t.step) for t in score.turns] == [(d.task_id, d.step) for d in firsts]
    assert [(t.parsed, t.matched) for t in score.turns] == [
        (True, True),
        (True, False),
        (False, False),
        (True, True),
    ]
    assert "back" in score.turns[1].reply
    sampled = await score_first_steps(engine, firsts, dialect, tokenizer, greedy=False, samples=3)
    assert sampled.prompts == 12 and sampled.matched == 6


def test_warm_start_cache_key_follows_what_the_model_depends_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cua_native.config import WarmStart
    from cua_native.training.warmstart import sft as module
    from cua_native.training.warmstart.sft import warm_start_key

    base = warm_start_key("mai_ui", WarmStart(), {"max_pixels": 65536}, {})
    assert base == warm_start_key("mai_ui", WarmStart(), {"max_pixels": 65536}, {})
    changed = [
        warm_start_key("qwen3_vl", WarmStart(), {"max_pixels": 65536}, {}),
        warm_start_key("mai_ui", WarmStart(steps=7), {"max_pixels": 65536}, {}),
        warm_start_key("mai_ui", WarmStart(), {"max_pixels": 4096}, {}),
        warm_start_key("mai_ui", WarmStart(), {"max_pixels": 65536}, {"screenshot_size": [1, 2]}),
        warm_start_key("mai_ui", WarmStart(gym_seeds=[0, 1]), {"max_pixels": 65536}, {}),
        warm_start_key("mai_ui", WarmStart(goal_in_thought=True), {"max_pixels": 65536}, {}),
        warm_start_key(
            "mai_ui", WarmStart(), {"max_pixels": 65536}, {}, tasks=TaskSource(task_ids=["x"])
        ),
        warm_start_key("mai_ui", WarmStart(), {"max_pixels": 65536}, {}, base="tiny-qwen3-vl-1"),
    ]
    # a new demonstration text format (``DEMO_FORMAT``) never reuses an old warm start
    with monkeypatch.context() as patch:
        patch.setattr(module, "DEMO_FORMAT", module.DEMO_FORMAT + 1)
        changed.append(warm_start_key("mai_ui", WarmStart(), {"max_pixels": 65536}, {}))
    assert base not in changed and len(set(changed)) == len(changed)
    # a reward-only sim option changes no demonstration: the same warm start is reused
    assert base == warm_start_key(
        "mai_ui", WarmStart(), {"max_pixels": 65536}, {"progress_reward": 0.5}
    )


def test_early_stops_add_one_terminate_turn_per_path(
    processor: Any, mai_demos: list[Demo], toy_source: Any
) -> None:
    """Share 1: every path keeps its clean turns and gains a ``terminate(success)`` turn on the
    prompt of one of its steps before the last (the toy paths have one such step)."""
    spec = DemoSpec(family="mai_ui", tasks=ALL, early_stop_share=1.0, seed=5)
    mixed = collect_demos(processor, spec, toy_source)
    early = [d for d in mixed if d.step == 0 and isinstance(d.action, m.Terminate)]
    clean = [d for d in mixed if not (d.step == 0 and isinstance(d.action, m.Terminate))]
    assert [d.text for d in clean] == [d.text for d in mai_demos]
    assert len(early) == 8 and {d.task_id for d in early} == {d.task_id for d in mai_demos}
    first_turns = {d.task_id: d for d in mai_demos if d.step == 0}
    for demo in early:
        assert demo.action == m.Terminate(status="success") and demo.step == 0
        twin = first_turns[demo.task_id]
        assert demo.prompt_length == twin.prompt_length
        assert torch.equal(
            demo.sample["input_ids"][0, : demo.prompt_length],
            twin.sample["input_ids"][0, : twin.prompt_length],
        )
        assert not isinstance(twin.action, m.Terminate)


def test_early_stop_share_picks_paths_by_seed(processor: Any, toy_source: Any) -> None:
    def early_tasks(share: float, seed: int) -> list[str]:
        spec = DemoSpec(family="mai_ui", tasks=ALL, early_stop_share=share, seed=seed)
        demos = collect_demos(processor, spec, toy_source)
        return sorted(d.task_id for d in demos if d.step == 0 and isinstance(d.action, m.Terminate))

    assert early_tasks(0.0, 1) == []
    half = early_tasks(0.5, 1)
    assert half == early_tasks(0.5, 1), "the same seed picks the same paths"
    draws = [early_tasks(0.5, seed) for seed in range(6)]
    assert any(0 < len(d) < 8 for d in draws) and len({tuple(d) for d in draws}) > 1


def test_early_stop_after_the_first_action_skips_one_action_paths(
    processor: Any, mai_demos: list[Demo], toy_source: Any
) -> None:
    """``early_stop_after=1``: the toy paths (one action, then done) have no step after their
    first action and before their last, so no path gains a stop; the clean turns are kept."""
    spec = DemoSpec(family="mai_ui", tasks=ALL, early_stop_share=1.0, early_stop_after=1, seed=5)
    assert [d.text for d in collect_demos(processor, spec, toy_source)] == [
        d.text for d in mai_demos
    ]


def test_early_stop_after_the_first_action_never_stops_on_the_first_screen(
    processor: Any,
) -> None:
    """On the simulator's three-step paths (open Settings, tap the switch, done), every
    path's early stop lands on its second screen when ``early_stop_after=1``; at 0, some land
    on the home screen every episode starts from."""
    toggles = TaskSource(split="all", task_ids=["sim-001", "sim-003", "sim-005"])
    source = source_for("mai_ui", {"screenshot_size": [160, 384]})

    def stop_steps(after: int) -> list[int]:
        spec = DemoSpec(
            family="mai_ui",
            prompt_overrides={"max_pixels": 65536},
            tasks=toggles,
            gym_seeds=(0, 1, 2, 3),
            early_stop_share=1.0,
            early_stop_after=after,
            seed=3,
        )
        demos = collect_demos(processor, spec, source)
        last: dict[tuple[str, int], int] = {}
        for d in demos:
            last[(d.task_id, d.gym_seed)] = max(d.step, last.get((d.task_id, d.gym_seed), 0))
        return [
            d.step
            for d in demos
            if isinstance(d.action, m.Terminate) and d.step < last[(d.task_id, d.gym_seed)]
        ]

    assert stop_steps(1) == [1] * 12
    anywhere = stop_steps(0)
    assert len(anywhere) == 12 and 0 in anywhere and 1 in anywhere


def test_reservoir_keeps_a_uniform_step() -> None:
    counts = [0, 0, 0]
    for seed in range(3000):
        rng = random.Random(seed)
        kept = None
        for index in range(3):
            if reservoir_keeps(rng, index + 1):
                kept = index
        assert kept is not None
        counts[kept] += 1
    assert all(850 < c < 1150 for c in counts), counts
