"""Supervised warm start of the embedded model on the simulator's solution paths.

A randomly initialised tiny model never emits a parseable action, so every GRPO group gets one
reward and no signal. A few hundred steps of AReaL's own SFT (``LMEngine`` with
``compute_packed_sft_loss``) on ``LocalTrainEngine`` teach it the output format and a rough
policy; RL then has reward variance to learn from. The result is a normal Hugging Face model
directory (model, processor, chat template), written atomically.

The run is a blocking batch job: call it from a thread when an event loop is running.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from cua_native.actions.dialects import Dialect
from cua_native.config import WarmStart
from cua_native.gym.sim.gym import REWARD_OPTIONS
from cua_native.rollout.dataset import TaskSource
from cua_native.training.warmstart.demos import (
    DEFAULT_TIMEOUT_S,
    DEMO_FORMAT,
    Demo,
    DemoSource,
    DemoSpec,
    collect_demos,
    same_action,
)

WARM_START_MARKER = "cua_native_warm_start.json"
"""Written last into a finished warm-start directory (its report as JSON)."""


def warm_start_key(
    family: str,
    settings: WarmStart,
    prompt_overrides: dict[str, Any],
    sim_options: dict[str, Any],
    tasks: TaskSource | None = None,
    base: str = "",
) -> str:
    """A short hash of everything a warm-started model depends on, to name its cache entry
    (a config change must not silently reuse a model trained for another prompt, screen or
    task selection; ``base`` names the model it starts from, e.g. the tiny model's
    fingerprinted directory)."""
    described = {
        "base": base,
        "demo_format": DEMO_FORMAT,
        "family": family,
        "warm_start": settings.model_dump(mode="json"),
        "prompt": prompt_overrides,
        # the reward shaping changes no demonstration
        "sim": {k: v for k, v in sim_options.items() if k not in REWARD_OPTIONS},
        "tasks": tasks.model_dump(mode="json") if tasks is not None else None,
    }
    text = json.dumps(described, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class WarmStartError(RuntimeError):
    """The warm start could not run (no demonstrations, a non-finite loss)."""


@dataclass(frozen=True)
class WarmStartReport:
    steps: int
    first_loss: float
    last_loss: float
    seconds: float
    """Wall time of the warm start up to saving (loading, demonstrations, training)."""
    demo_seconds: float
    train_seconds: float
    demos: int
    tasks: int
    out_dir: str
    losses: list[float] = field(default_factory=list)
    """Token-mean SFT loss of every step's batch."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def batch_order(count: int, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """Demo indices for each step: seeded reshuffled epochs, cut into batches, ``steps`` long.

    A batch never repeats a demo; with ``batch_size >= count`` every batch is all demos.
    """
    if count <= 0:
        raise WarmStartError("no demonstrations to train on")
    size = min(batch_size, count)
    rng = random.Random(seed)
    batches: list[list[int]] = []
    pool: list[int] = []
    while len(batches) < steps:
        if len(pool) < size:
            fresh = list(range(count))
            rng.shuffle(fresh)
            pool = pool + [i for i in fresh if i not in pool]
        batches.append(pool[:size])
        pool = pool[size:]
    return batches


def train_sft(
    engine: Any,
    demos: list[Demo],
    settings: WarmStart,
    progress: bool = False,
) -> list[float]:
    """``settings.steps`` steps of AReaL's SFT (``LMEngine.train_lm``) on ``engine``.

    Returns each step's token-mean loss as AReaL's ``compute_packed_sft_loss`` records it
    (``sft/loss/avg`` in the stats tracker, exported and reset after every step).
    """
    from areal.trainer.sft.lm_engine import LMEngine
    from areal.utils import stats_tracker
    from tqdm import tqdm

    trainer = LMEngine(engine)
    losses: list[float] = []
    order = batch_order(len(demos), settings.batch_size, settings.steps, settings.seed)
    bar = tqdm(order, desc="warm start", unit="step", file=sys.stderr, disable=not progress)
    try:
        for indices in bar:
            trainer.train_lm([demos[i].sample for i in indices])
            stats = stats_tracker.export_all(reset=True)
            loss = float(stats.get("sft/loss/avg", float("nan")))
            if not math.isfinite(loss):
                raise WarmStartError(f"SFT loss is not finite at step {len(losses)}: {loss}")
            losses.append(loss)
            bar.set_postfix(loss=f"{loss:.3f}")
    finally:
        bar.close()
    return losses


def save_model_dir(model: Any, processor: Any, out_dir: Path, report: dict[str, Any]) -> None:
    """Write model + processor to a scratch sibling, then move it into place (atomic)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    scratch = out_dir.parent / f".{out_dir.name}.{os.getpid()}.tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        model.save_pretrained(scratch)
        processor.save_pretrained(scratch)
        (scratch / WARM_START_MARKER).write_text(json.dumps(report, indent=2))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        scratch.rename(out_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def warm_start(
    model_dir: Path,
    out_dir: Path,
    settings: WarmStart,
    family: str,
    prompt_overrides: dict[str, Any] | None = None,
    progress: bool = False,
    *,
    tasks: TaskSource | None = None,
    gym_seeds: tuple[int, ...] = (0,),
    demo_source: DemoSource | None = None,
    demo_concurrency: int = 4,
    demo_timeout_s: float = DEFAULT_TIMEOUT_S,
    num_threads: int | None = None,
    torch_compile: bool = False,
    device: str = "cpu",
) -> WarmStartReport:
    """Fine-tune the model at ``model_dir`` on sim demonstrations; save it to ``out_dir``.

    ``tasks`` selects the sim tasks whose solution paths become demonstrations (default: the
    training split, as ``cua.tasks`` defaults to); ``gym_seeds`` the simulator seeds they are
    played under; ``demo_source`` makes the gym and its solver (default: the simulator), which
    plays ``demo_concurrency`` paths at once with ``demo_timeout_s`` on every call.
    ``num_threads`` sets torch's CPU threads for this process. ``torch_compile=False``
    runs AReaL's ``torch.compile``'d log-prob helper eagerly (scoped to this call): on CPU its
    compilation costs more than the whole warm start.
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from cua_native.training.local_engine import LocalTrainEngine

    start = time.perf_counter()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    torch.manual_seed(settings.seed)
    processor = AutoProcessor.from_pretrained(str(model_dir))
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32)

    spec = DemoSpec(
        family=family,
        prompt_overrides=dict(prompt_overrides or {}),
        tasks=tasks or TaskSource(split="train"),
        gym_seeds=gym_seeds,
        goal_in_thought=settings.goal_in_thought,
        early_stop_share=settings.early_stop_share,
        early_stop_after=settings.early_stop_after,
        seed=settings.seed,
        concurrency=demo_concurrency,
        timeout_s=demo_timeout_s,
    )
    demo_start = time.perf_counter()
    demos = collect_demos(processor, spec, demo_source)
    demo_seconds = time.perf_counter() - demo_start
    if not demos:
        raise WarmStartError("the task selection produced no demonstrations")

    engine = LocalTrainEngine(model, lr=settings.lr, processor=processor, device=device)
    train_start = time.perf_counter()
    with ExitStack() as stack:
        if not torch_compile:
            stack.enter_context(torch._dynamo.config.patch(disable=True))
        losses = train_sft(engine, demos, settings, progress)
    train_seconds = time.perf_counter() - train_start
    model.eval()

    report = WarmStartReport(
        steps=len(losses),
        first_loss=losses[0] if losses else float("nan"),
        last_loss=losses[-1] if losses else float("nan"),
        seconds=time.perf_counter() - start,
        demo_seconds=demo_seconds,
        train_seconds=train_seconds,
        demos=len(demos),
        tasks=len({d.task_id for d in demos}),
        out_dir=str(out_dir),
        losses=losses,
    )
    save_model_dir(model.cpu(), processor, Path(out_dir), report.to_json())
    return report


@dataclass(frozen=True)
class TurnOutcome:
    """One generation for one demonstrated turn: did it parse, did it match, what it said."""

    task_id: str
    gym_seed: int
    step: int
    parsed: bool
    matched: bool
    reply: str


@dataclass(frozen=True)
class FirstStepScore:
    """How a model does on demonstrated turns (the first steps of held-out tasks, or every
    turn of a path) in one decoding mode."""

    mode: str
    prompts: int
    parsed: int
    """Outputs the dialect parsed into an action."""
    matched: int
    """Parsed actions equal to the solution's action (points within the tolerance)."""
    turns: tuple[TurnOutcome, ...] = ()
    """Every generation, in the order of the demos (each demo ``samples`` times in a row)."""

    @property
    def parse_rate(self) -> float:
        return self.parsed / self.prompts if self.prompts else 0.0

    @property
    def match_rate(self) -> float:
        return self.matched / self.prompts if self.prompts else 0.0


async def demo_reply(engine: Any, demo: Demo, gconfig: Any, tokenizer: Any) -> str:
    """The model's text for ``demo``'s prompt (its demonstrated history, teacher-forced),
    generated with ``engine.agenerate`` under ``gconfig`` and cut at its stop tokens."""
    from areal.api.io_struct import ModelRequest

    from cua_native.rollout.agent import decode_output

    request = ModelRequest(
        input_ids=demo.sample["input_ids"][0, : demo.prompt_length].tolist(),
        gconfig=gconfig.new(),
        tokenizer=tokenizer,
        metadata={"multi_modal_input": demo.sample["multi_modal_input"][0]},
    )
    response = await engine.agenerate(request)
    return decode_output(tokenizer, list(response.output_tokens), gconfig.stop_token_ids)


async def score_first_steps(
    engine: Any,
    demos: Sequence[Demo],
    dialect: Dialect,
    tokenizer: Any,
    *,
    greedy: bool,
    samples: int = 1,
    max_new_tokens: int = 128,
    tolerance: float = 0.05,
) -> FirstStepScore:
    """Generate for every demo's prompt with ``engine.agenerate`` (AReaL's interface) and
    compare the parsed action with the demonstrated one; ``samples`` draws per prompt."""
    from areal.api.cli_args import GenerationHyperparameters

    from cua_native.rollout.factories import stop_token_ids

    gconfig = GenerationHyperparameters(
        n_samples=1,
        max_new_tokens=max_new_tokens,
        greedy=greedy,
        temperature=1.0,
        stop_token_ids=stop_token_ids(tokenizer),
    )

    async def one(demo: Demo) -> TurnOutcome:
        text = await demo_reply(engine, demo, gconfig, tokenizer)
        parsed = dialect.parse(text, image_size=demo.image_size)
        action = parsed.action if parsed.ok else None
        matched = action is not None and same_action(action, demo.action, tolerance)
        return TurnOutcome(
            demo.task_id, demo.gym_seed, demo.step, action is not None, matched, text
        )

    draws = samples if not greedy else 1
    results = await asyncio.gather(*(one(d) for d in demos for _ in range(draws)))
    return FirstStepScore(
        mode="greedy" if greedy else "sampled",
        prompts=len(results),
        parsed=sum(t.parsed for t in results),
        matched=sum(t.matched for t in results),
        turns=tuple(results),
    )
