"""Demonstrations for the warm start: the simulator's solution paths as AReaL SFT rows.

Each sim task is played along its solution path in a fresh execution. At every step the real
``PromptBuilder`` builds the prompt from the real history convention (what the episode loop
would have seen had the model emitted exactly the demonstrated text), and the target is the
dialect's ``format()`` of the solution action with a short deterministic thought, followed by
the stop token ``<|im_end|>``. A row is ``input_ids`` = prompt + target, ``loss_mask`` 1 on the
target tokens (stop token included), ``attention_mask``, ``mm_token_type_ids`` and
``multi_modal_input`` (batch dimension 1), the layout ``trajectory.turn_sample`` produces.

Only paths whose execution evaluates as a success become demonstrations. With
``DemoSpec.early_stop_share`` a share of them also carries one imperfect turn: a premature
``terminate(success)`` on the prompt of one of their steps (``early_stop_draw``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from areal.api.cli_args import GenerationHyperparameters

from cua_native.actions import models as m
from cua_native.actions.dialects import Dialect
from cua_native.gym.protocol import Execution, Gym, Observation, Task, final_answer
from cua_native.prompts import HistoryStep, PromptBuilder, default_prompt_config
from cua_native.rollout.agent import feedback_for
from cua_native.rollout.dataset import TaskSource, select_tasks
from cua_native.rollout.episode import close_execution
from cua_native.rollout.trajectory import VisionTokens, sequence_row

logger = logging.getLogger(__name__)

STOP_TOKEN = "<|im_end|>"
DEMO_FORMAT = 3
"""Version of the demonstrated text (``thought_for``, ``format_target``): part of the
warm-start cache key, so bump it whenever a change alters what a demonstration says."""
DEFAULT_TIMEOUT_S = 60.0


class DemoError(RuntimeError):
    """A solution path could not be turned into demonstrations."""


@dataclass(frozen=True)
class DemoSpec:
    """Which demonstrations to make: model family, prompt, tasks, simulator seeds."""

    family: str
    prompt_overrides: dict[str, Any] = field(default_factory=dict)
    tasks: TaskSource = field(default_factory=lambda: TaskSource(split="train"))
    gym_seeds: tuple[int, ...] = (0,)
    goal_in_thought: bool = False
    """Begin each turn's thought with the task's instruction (see ``thought_for``)."""
    early_stop_share: float = 0.0
    """Share of paths that also get an early ``terminate(success)`` turn (``early_stop_draw``)."""
    early_stop_after: int = 0
    """An early stop comes after at least this many of the path's actions (0: any step before
    the last, the first screen included)."""
    seed: int = 0
    """Seeds which paths stop early, and where."""
    concurrency: int = 4
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Limit on every gym and prompt call."""


@dataclass(frozen=True)
class Demo:
    """One demonstrated turn."""

    task_id: str
    gym_seed: int
    step: int
    action: m.Action
    text: str
    """What the model should write (without the stop token)."""
    image_size: tuple[int, int]
    """The screenshot size the model saw (the coordinate frame of ``text``)."""
    prompt_length: int
    sample: dict[str, Any]
    """The AReaL row (batch dimension 1)."""


def thought_for(action: m.Action, label: str | None = None, goal: str | None = None) -> str:
    """A short deterministic thought for ``action`` ("Tap Wi-Fi."); with ``goal`` (the task's
    instruction) the thought restates it first ("Goal: Turn on Wi-Fi. Tap Wi-Fi."), so the
    step's decision reads the instruction from the thought just written, a few tokens back,
    instead of from the user turn hundreds of tokens back."""
    said = _action_thought(action, label)
    return f"Goal: {goal.strip()} {said}" if goal else said


def _action_thought(action: m.Action, label: str | None) -> str:
    target = label or "the target"
    match action:
        case m.Click():
            return f"Tap {target}."
        case m.DoubleClick() | m.TripleClick():
            return f"Tap {target} repeatedly."
        case m.LongPress():
            return f"Long-press {target}."
        case m.Swipe(direction=str() as direction):
            return f"Swipe {direction}."
        case m.Swipe() | m.Drag():
            return f"Drag {label}." if label else "Drag on the screen."
        case m.Scroll():
            return "Scroll the list."
        case m.TypeText():
            return f'Type "{action.text}".'
        case m.OpenApp():
            return f"Open {action.name}."
        case m.Key():  # desktops only (the simulator's paths press no keys)
            return f"Press {'+'.join(action.keys)}."
        case m.SystemButton():
            return f"Press {action.button}."
        case m.Answer():
            return f"The answer is {action.text}."
        case m.Terminate():
            return "The task is done." if action.status == "success" else "The task failed."
        case _:
            return f"{action.type.replace('_', ' ').capitalize()}."


def format_target(
    dialect: Dialect,
    action: m.Action,
    thought: str,
    image_size: tuple[int, int],
    summary: str | None,
) -> str:
    """The dialect's text for ``action``; Qwen prompts with a response format also get the
    ``Action: "…"`` summary line (``summary``: what the step does, never the goal, since
    later prompts list the summaries as the history)."""
    return dialect.format(action, thought=thought, summary=summary, image_size=image_size)


def demo_sample(
    prompt_ids: Sequence[int],
    multi_modal_input: dict[str, torch.Tensor],
    target_ids: Sequence[int],
    tokens: VisionTokens,
) -> dict[str, Any]:
    """One SFT row (the rollout's ``sequence_row``): loss on exactly the target tokens."""
    if not target_ids:
        raise DemoError("a demonstration needs at least one target token")
    return sequence_row(prompt_ids, target_ids, multi_modal_input, tokens)


def same_action(a: m.Action, b: m.Action, tolerance: float) -> bool:
    """Equal actions, points compared within ``tolerance`` (normalized units)."""
    if a.type != b.type:
        return False
    da, db = a.model_dump(), b.model_dump()
    for key in da.keys() | db.keys():
        va, vb = da.get(key), db.get(key)
        if isinstance(va, float) and isinstance(vb, float) and key in ("x", "y", "x2", "y2"):
            if abs(va - vb) > tolerance:
                return False
        elif isinstance(va, str) and isinstance(vb, str):
            if va.casefold().strip() != vb.casefold().strip():
                return False
        elif va != vb:
            return False
    return True


@dataclass(frozen=True)
class DemoKit:
    """What every demonstrated turn needs: the real prompt builder, dialect and tokenizer."""

    builder: PromptBuilder
    dialect: Dialect
    tokenizer: Any
    tokens: VisionTokens
    stop_id: int
    summary: bool
    gconfig: GenerationHyperparameters
    goal_in_thought: bool = False


async def _timed(call: Any, limit: float, what: str) -> Any:
    try:
        async with asyncio.timeout(limit):
            return await call
    except TimeoutError as error:
        raise DemoError(f"{what} timed out after {limit:.0f}s") from error


def _target(
    kit: DemoKit, action: m.Action, label: str | None, size: tuple[int, int], goal: str
) -> str:
    said = thought_for(action, label)
    thought = thought_for(action, label, goal) if kit.goal_in_thought else said
    text = format_target(kit.dialect, action, thought, size, said if kit.summary else None)
    parsed = kit.dialect.parse(text, image_size=size)
    step = kit.dialect.coordinate_step(size)
    if parsed.action is None or not same_action(parsed.action, action, step):
        raise DemoError(f"the dialect does not read back its own text {text!r} as {action!r}")
    return text


@dataclass(frozen=True)
class EarlyStop:
    """Where one path's early stop may fall: a step drawn uniformly (from ``rng``) among the
    path's steps from ``first_step`` up to, not including, its last."""

    rng: random.Random
    first_step: int = 0


def early_stop_draw(spec: DemoSpec, task_id: str, gym_seed: int) -> EarlyStop | None:
    """This path's early stop, or ``None`` when the path stays clean: each (seed, phone, task)
    path stops early with probability ``spec.early_stop_share``, independently of every other
    path, at a step after at least ``spec.early_stop_after`` of its actions."""
    if spec.early_stop_share <= 0.0:
        return None
    rng = random.Random(f"early-stop:{spec.seed}:{gym_seed}:{task_id}")
    if rng.random() >= spec.early_stop_share:
        return None
    return EarlyStop(rng, first_step=spec.early_stop_after)


def reservoir_keeps(rng: random.Random, seen: int) -> bool:
    """Reservoir sampling of one item: keep the ``seen``-th item (1-based) with probability
    ``1 / seen``. Over a stream of any length, the item kept last is uniform over it."""
    return rng.randrange(seen) == 0


class Solver(Protocol):
    """The next step of a task's solution path on the execution's current screen: the action
    and the label of the element it touches (for the thought), or ``None`` when done."""

    def __call__(
        self, execution: Execution, task: Task
    ) -> Awaitable[tuple[m.Action, str | None] | None]: ...


async def task_demos(
    gym: Gym,
    solver: Solver,
    task: Task,
    kit: DemoKit,
    gym_seed: int,
    timeout_s: float,
    early_stop: EarlyStop | None = None,
) -> list[Demo]:
    """Play ``task``'s solution path in a fresh execution; one ``Demo`` per step. A path that
    stops without ``answer``/``terminate`` gets ``terminate(success)`` as its last step, so the
    model learns to end the episode. With ``early_stop``, one more ``Demo``: at a step drawn
    uniformly (from ``early_stop.rng``) among those from ``early_stop.first_step`` before the
    last, ``terminate(success)`` on the same prompt; the path itself is unchanged (and a path
    with no such step gets none).

    Raises ``DemoError`` if the path does not end in a successful evaluation.
    """
    execution: Execution = await _timed(
        gym.start(task, {"seed": gym_seed}), timeout_s, f"start of {task.task_id}"
    )
    try:
        demos: list[Demo] = []
        history: list[HistoryStep] = []
        observation: Observation = await _timed(execution.observe(), timeout_s, "observe")
        answer: str | None = None
        early_step: tuple[int, Any, Any] | None = None  # (step, prompt, image) kept so far
        candidates = 0
        limit = task.max_steps or 30
        for step in range(limit + 1):
            planned = await _timed(solver(execution, task), timeout_s, "solution step")
            if planned is None:
                planned = (m.Terminate(status="success"), None)
            action, label = planned
            prepared = await _timed(
                kit.builder.prepare_image(observation.screenshot), timeout_s, "prepare_image"
            )
            built = await _timed(
                kit.builder.build(task, list(history), prepared, kit.gconfig), timeout_s, "build"
            )
            turn = _demo_turn(kit, task, gym_seed, step, (action, label), built, prepared)
            demos.append(turn)
            if isinstance(action, m.Answer | m.Terminate):
                answer = final_answer(action)
                break
            if early_stop is not None and step >= early_stop.first_step:
                candidates += 1  # uniform over the eligible steps before the last
                if reservoir_keeps(early_stop.rng, candidates):
                    early_step = (step, built, prepared)
            result = await _timed(execution.act(action), timeout_s, "act")
            parsed = kit.dialect.parse(turn.text, image_size=prepared.model_size)
            history.append(
                HistoryStep(
                    screenshot=prepared,
                    parsed=parsed,
                    raw_text=turn.text,
                    feedback=feedback_for(parsed, result),
                )
            )
            observation = result.observation or await _timed(
                execution.observe(), timeout_s, "observe"
            )
        else:
            raise DemoError(f"{task.task_id}: the solution path is longer than {limit} steps")
        evaluation = await _timed(execution.evaluate(answer), timeout_s, "evaluate")
        if not evaluation.success:
            raise DemoError(f"{task.task_id}: the solution path does not succeed ({evaluation})")
        if early_step is not None:
            done = (m.Terminate(status="success"), None)
            demos.append(_demo_turn(kit, task, gym_seed, early_step[0], done, *early_step[1:]))
        return demos
    finally:
        await close_execution(execution, timeout_s)


def _demo_turn(
    kit: DemoKit,
    task: Task,
    gym_seed: int,
    step: int,
    planned: tuple[m.Action, str | None],
    built: Any,
    prepared: Any,
) -> Demo:
    """The demonstrated turn ``planned`` (action, label) on the prompt ``built`` at ``step``."""
    action, label = planned
    text = _target(kit, action, label, prepared.model_size, task.instruction)
    target_ids = kit.tokenizer(text, add_special_tokens=False)["input_ids"]
    sample = demo_sample(
        built.input_ids, built.multi_modal_input, [*target_ids, kit.stop_id], kit.tokens
    )
    return Demo(
        task_id=task.task_id,
        gym_seed=gym_seed,
        step=step,
        action=action,
        text=text,
        image_size=prepared.model_size,
        prompt_length=len(built.input_ids),
        sample=sample,
    )


async def generate_demos(
    gym: Gym, solver: Solver, tasks: Sequence[Task], kit: DemoKit, spec: DemoSpec
) -> list[Demo]:
    """Demonstrations of every task under every seed, in (seed, task) order. A task whose
    path fails (``DemoError``) is logged and left out; any other error propagates."""
    gate = asyncio.Semaphore(max(1, spec.concurrency))

    async def one(task: Task, seed: int) -> list[Demo]:
        async with gate:
            try:
                early_stop = early_stop_draw(spec, task.task_id, seed)
                return await task_demos(gym, solver, task, kit, seed, spec.timeout_s, early_stop)
            except DemoError as error:
                logger.warning("no demonstration for %s (seed %d): %s", task.task_id, seed, error)
                return []

    results = await asyncio.gather(*(one(t, s) for s in spec.gym_seeds for t in tasks))
    return [demo for group in results for demo in group]


def make_kit(processor: Any, spec: DemoSpec, executor: Any = None) -> DemoKit:
    """The real prompt builder and the dialect its prompt teaches."""
    config = default_prompt_config(spec.family, **spec.prompt_overrides)
    builder = PromptBuilder(config, processor, executor=executor)
    tokenizer = processor.tokenizer
    stop_id = tokenizer.convert_tokens_to_ids(STOP_TOKEN)
    if stop_id is None or stop_id == tokenizer.unk_token_id:
        raise DemoError(f"the tokenizer has no {STOP_TOKEN} token")
    return DemoKit(
        builder=builder,
        dialect=builder.dialect,
        tokenizer=tokenizer,
        tokens=VisionTokens.from_tokenizer(tokenizer),
        stop_id=int(stop_id),
        summary=config.family == "qwen3_vl" and bool(config.response_format),
        gconfig=GenerationHyperparameters(n_samples=1),
        goal_in_thought=spec.goal_in_thought,
    )


async def demos_from_gym(
    gym: Gym, solver: Solver, processor: Any, spec: DemoSpec, executor: Any = None
) -> list[Demo]:
    """Demonstrations of ``spec.tasks`` (selected from ``gym.list_tasks()``) on ``gym``."""
    kit = make_kit(processor, spec, executor)
    # One copy per task: ``spec.gym_seeds`` says which phones it is demonstrated on.
    selected = select_tasks(await gym.list_tasks(), spec.tasks)
    tasks = list({t.task_id: t for t in selected}.values())
    return await generate_demos(gym, solver, tasks, kit, spec)


DemoSource = Callable[[Any], tuple[Gym, Solver]]
"""Makes the gym and its solver, given the executor for heavy work."""


SWIPE_STYLES: dict[str, str] = {"mai_ui": "direction", "qwen3_vl": "points"}
"""How each family's dialect writes a swipe (MAI-UI: direction + start; Qwen: two points)."""


def sim_source(
    executor: Any = None,
    swipe_style: str = "direction",
    sim_options: dict[str, Any] | None = None,
) -> tuple[Gym, Solver]:
    """The embedded simulator (``SimGym(**sim_options)``, seed 0, reward-only options left
    out: demonstrations read success alone) and its solution paths
    (``SimExecution.solution_step``)."""
    from cua_native.gym.sim import SimGym
    from cua_native.gym.sim.gym import REWARD_OPTIONS

    async def solve(execution: Any, task: Task) -> tuple[m.Action, str | None] | None:
        return execution.solution_step(swipe_style)  # type: ignore[no-any-return]

    kept = {k: v for k, v in (sim_options or {}).items() if k not in REWARD_OPTIONS}
    options = {**kept, "seed": 0}
    return SimGym(executor=executor, **options), solve


def source_for(family: str, sim_options: dict[str, Any] | None = None) -> DemoSource:
    """``sim_source`` with the swipe form ``family``'s dialect can write; ``sim_options`` are
    the training gym's (demonstrations must show the screenshots training will show)."""
    return functools.partial(
        sim_source,
        swipe_style=SWIPE_STYLES.get(family, "direction"),
        sim_options=dict(sim_options or {}),
    )


def collect_demos(processor: Any, spec: DemoSpec, source: DemoSource | None = None) -> list[Demo]:
    """Blocking: ``demos_from_gym`` in an event loop of its own on a worker thread (callable
    from anywhere, including a thread of a running loop); the gym is closed afterwards."""

    async def run(pool: ThreadPoolExecutor) -> list[Demo]:
        gym, solver = (source or source_for(spec.family))(pool)
        try:
            return await demos_from_gym(gym, solver, processor, spec, pool)
        finally:
            await gym.aclose()

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="demos") as pool:
        return pool.submit(asyncio.run, run(pool)).result()
