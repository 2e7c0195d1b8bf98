"""Per-step credit on a toy gym whose executions fork: branching rollouts (per-turn advantages
of the tree of same-state siblings, hand-computed), anchor-state groups, success replay
(original versions and log-probs), dynamic sampling, and the budget."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from areal.api.io_struct import ModelRequest, ModelResponse
from PIL import Image

from cua_native.actions import models as m
from cua_native.gym.protocol import (
    Evaluation,
    ExecutionGone,
    ForkUnsupported,
    Observation,
    Screenshot,
    StepResult,
    Task,
)
from cua_native.rollout.config import AgentConfig
from cua_native.rollout.factories import make_agent, stop_token_ids
from cua_native.rollout.workflow import CUAAgentWorkflow, GroupOutcome

POINTS = {"L": (0.25, 0.5), "R": (0.75, 0.5), "good": (0.5, 0.25), "bad": (0.5, 0.75)}
REWARDS = {("L", "good"): 1.0, ("R", "good"): 0.5}
"""The toy task: a path of two taps; ``L`` then ``good`` is worth 1, ``R`` then ``good`` 0.5,
anything else 0."""


def _tap(label: str) -> m.Click:
    x, y = POINTS[label]
    return m.Click(x=x, y=y)


def _label(action: m.Action) -> str:
    assert isinstance(action, m.Click)
    return min(POINTS, key=lambda k: abs(POINTS[k][0] - action.x) + abs(POINTS[k][1] - action.y))


@dataclass
class PathExecution:
    """Its state is the path of taps so far; the screen's colour is a function of it."""

    execution_id: str
    task: Task
    gym: PathGym
    path: list[str] = field(default_factory=list)
    closed: bool = False

    async def observe(self) -> Observation:
        if self.closed:
            raise ExecutionGone(self.execution_id)
        shade = hash(tuple(self.path)) % 200
        image = Image.new("RGB", (90, 200), (shade, 40 * len(self.path), 120))
        return Observation(Screenshot(image=image), 90, 200, turn=len(self.path))

    async def act(self, action: m.Action) -> StepResult:
        self.path.append(_label(action))
        return StepResult(ok=True, observation=await self.observe())

    async def evaluate(self, answer: str | None = None) -> Evaluation:
        reward = REWARDS.get(tuple(self.path[:2]), 0.0)  # type: ignore[arg-type]
        return Evaluation(reward=reward, success=reward == 1.0)

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.gym.closed += 1

    async def fork(self) -> PathExecution:
        self.gym.forks += 1
        return PathExecution(f"p{next(self.gym.ids)}", self.task, self.gym, list(self.path))


@dataclass
class PathGym:
    gym_id: str = "paths"
    forkable: bool = True
    ids: itertools.count[int] = field(default_factory=itertools.count)
    started: int = 0
    forks: int = 0
    closed: int = 0

    async def list_tasks(self) -> list[Task]:
        return [Task(task_id="path-1", instruction="Tap the right path")]

    async def get_task(self, task_id: str) -> Task:
        return (await self.list_tasks())[0]

    async def start(self, task: Task, options: dict[str, Any] | None = None) -> Any:
        self.started += 1
        cls = PathExecution if self.forkable else _Unforkable
        return cls(f"p{next(self.ids)}", task, self)

    async def aclose(self) -> None:
        return None


@dataclass
class _Unforkable:
    """A ``PathExecution`` without ``fork`` (a backend that cannot copy its state)."""

    execution_id: str
    task: Task
    gym: PathGym
    inner: PathExecution = field(init=False)

    def __post_init__(self) -> None:
        self.inner = PathExecution(self.execution_id, self.task, self.gym)

    async def observe(self) -> Observation:
        return await self.inner.observe()

    async def act(self, action: m.Action) -> StepResult:
        return await self.inner.act(action)

    async def evaluate(self, answer: str | None = None) -> Evaluation:
        return await self.inner.evaluate(answer)

    async def close(self) -> None:
        await self.inner.close()


class StateEngine:
    """A real ``agenerate`` whose choice depends on the prompt: the n-th request with a given
    prompt (same screen and history) gets the n-th action of its turn's list, so same-state
    siblings differ and the root's own sample is always the first (it is drawn before its
    siblings exist). Turn 2 terminates. Log-probs are -0.5 a token, versions ``version``."""

    def __init__(
        self, processor: Any, config: AgentConfig, first: list[str], vary: bool = True
    ) -> None:
        self.vary = vary
        """False: every request counts as its prompt's first (all episodes act alike)."""
        self.tokenizer = processor.tokenizer
        self.dialect = make_agent(config, processor).dialect
        self.stop = stop_token_ids(self.tokenizer)[0]
        self.first = first
        self.seen: Counter[tuple[int, ...]] = Counter()
        self.version = 0

    def get_version(self) -> int:
        return self.version

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        turn = int(req.metadata["turn"])
        key = tuple(req.input_ids)
        n = self.seen[key] if self.vary else 0
        self.seen[key] += 1
        if turn == 0:
            action: m.Action = _tap(self.first[n % len(self.first)])
        elif turn == 1:
            action = _tap("good" if n % 2 == 0 else "bad")
        else:
            action = m.Terminate(status="success")
        text = self.dialect.format(action, thought="go")
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.stop]
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=ids,
            output_logprobs=[-0.5] * len(ids),
            output_versions=[self.version] * len(ids),
            stop_reason="stop",
        )


def _config(**credit: Any) -> AgentConfig:
    return AgentConfig.model_validate(
        {
            "max_turns": 4,
            "group_size": credit.pop("group_size", 2),
            "turn_discount": 0.9,
            "group_reward_norm": "mean",
            "encode_images": False,
            "credit": credit,
        }
    )


def _paths(outcome: GroupOutcome) -> dict[tuple[str, ...], list[float]]:
    """Each episode's labels (its sibling's prefix included) → its turns' advantages."""
    by_id = {r.record.context.episode_id: r.record for r in outcome.runs}
    out: dict[tuple[str, ...], list[float]] = {}
    for run in outcome.runs:
        record = run.record
        labels = [
            _label(t.parsed.action) for t in record.turns if isinstance(t.parsed.action, m.Click)
        ]
        if record.origin is not None:
            parent = by_id[record.origin.parent_id]
            prefix = [t for t in parent.turns if t.index < record.origin.turn]
            labels = [_label(t.parsed.action) for t in prefix] + labels  # type: ignore[arg-type]
        key = ("sibling:" if record.origin else "root:", *labels)
        assert key not in out
        out[key] = [t.reward for t in record.turns]
    return out


def _same(actual: dict[Any, list[float]], expected: dict[Any, list[float]]) -> None:
    assert set(actual) == set(expected)
    for key, values in expected.items():
        assert actual[key] == pytest.approx(values), key


def _rows_match(outcome: GroupOutcome) -> None:
    """The rows carry the turns' advantages, in the runs' order."""
    assert outcome.samples is not None
    expected = [t.reward for r in outcome.runs for t in r.record.turns]
    assert outcome.samples["rewards"].tolist() == pytest.approx(expected)


async def test_branching_advantages_equal_the_hand_computed_tree(processor) -> None:
    config = _config(branch={"enabled": True, "trigger": "schedule", "turns": [1]})
    gym = PathGym()
    engine = StateEngine(processor, config, first=["L", "R"])
    workflow = CUAAgentWorkflow(config, gym=gym, processor=processor)
    outcome = await workflow.arun_group(engine, {"task": (await gym.list_tasks())[0]})
    # Roots L→good (1.0) and R→good (0.5) each forked at turn 1 into a sibling that tapped
    # "bad" (0.0). Sibling sets (mean baseline, gamma 0.9 inside a segment):
    #   at (L, turn 1): {1.0, 0.0} → +0.5 / -0.5;  at (R, turn 1): {0.5, 0.0} → +0.25 / -0.25
    #   roots: V(L) = mean(1, 0) = 0.5, V(R) = mean(0.5, 0) = 0.25 → +0.125 / -0.125
    _same(
        _paths(outcome),
        {
            ("root:", "L", "good"): [0.125, 0.9 * 0.5, 0.5],
            ("sibling:", "L", "bad"): [0.9 * -0.5, -0.5],
            ("root:", "R", "good"): [-0.125, 0.9 * 0.25, 0.25],
            ("sibling:", "R", "bad"): [0.9 * -0.25, -0.25],
        },
    )
    _rows_match(outcome)
    assert (outcome.branch.points, outcome.branch.siblings, outcome.branch.extra_turns) == (2, 2, 4)
    assert outcome.env_steps == 3 + 2 + 3 + 2
    assert gym.forks == 2 and gym.started == 2 and gym.closed == 4


async def test_plain_grpo_pushes_down_the_right_first_step_of_a_failed_episode(processor) -> None:
    """The contrast: without branching, R→good's first tap and L→bad's are judged by their
    episodes only (here L→bad gets the lowest advantage on its right first step)."""
    config = _config(group_size=3)
    gym = PathGym()
    engine = StateEngine(processor, config, first=["L", "R"])
    workflow = CUAAgentWorkflow(config, gym=gym, processor=processor)
    outcome = await workflow.arun_group(engine, {"task": (await gym.list_tasks())[0]})
    paths = _paths(outcome)
    # rewards 1, 0.5, 0 → mean 0.5
    assert paths[("root:", "L", "bad")] == pytest.approx([0.81 * -0.5, 0.9 * -0.5, -0.5])
    assert paths[("root:", "L", "good")] == pytest.approx([0.81 * 0.5, 0.9 * 0.5, 0.5])
    assert paths[("root:", "R", "good")] == pytest.approx([0.0, 0.0, 0.0])


async def test_the_branching_budget_bounds_the_branch_points(processor) -> None:
    config = _config(branch={"enabled": True, "trigger": "schedule", "turns": [1], "max_points": 1})
    gym = PathGym()
    workflow = CUAAgentWorkflow(config, gym=gym, processor=processor)
    engine = StateEngine(processor, config, first=["L", "R"])
    outcome = await workflow.arun_group(engine, {"task": (await gym.list_tasks())[0]})
    assert outcome.branch.points == 1 and gym.forks == 1 and len(outcome.runs) == 3
    _rows_match(outcome)


async def test_anchor_groups_equal_the_hand_computed_step_advantages(processor) -> None:
    config = _config(group_size=3, anchor={"enabled": True})
    gym = PathGym(forkable=False)  # anchors need no fork
    engine = StateEngine(processor, config, first=["L", "R"])
    workflow = CUAAgentWorkflow(config, gym=gym, processor=processor)
    outcome = await workflow.arun_group(engine, {"task": (await gym.list_tasks())[0]})
    # Episodes L→good (1), R→good (0.5), L→bad (0); episode advantages +0.5, 0, -0.5,
    # discounted: [0.405, 0.45, 0.5], 0, [-0.405, -0.45, -0.5]. Anchors: the first screen
    # (returns 0.81 × R: 0.81, 0.405, 0 → ±0.405, 0) and L's screen at turn 1 (returns
    # 0.9 × R: 0.9, 0 → ±0.45); every other screen is seen once.
    _same(
        _paths(outcome),
        {
            ("root:", "L", "good"): [0.405 + 0.405, 0.45 + 0.45, 0.5],
            ("root:", "R", "good"): [0.0, 0.0, 0.0],
            ("root:", "L", "bad"): [-0.405 - 0.405, -0.45 - 0.45, -0.5],
        },
    )
    assert outcome.anchor_groups == 2
    _rows_match(outcome)


async def test_branching_on_a_gym_that_cannot_fork_fails_loudly(processor) -> None:
    config = _config(branch={"enabled": True, "trigger": "schedule", "turns": [1]})
    gym = PathGym(forkable=False)
    engine = StateEngine(processor, config, first=["L", "R"])
    workflow = CUAAgentWorkflow(config, gym=gym, processor=processor)
    with pytest.raises(ForkUnsupported, match="cannot fork"):
        await workflow.arun_group(engine, {"task": (await gym.list_tasks())[0]})
    assert gym.started == gym.closed


async def test_replayed_samples_carry_their_original_versions(processor) -> None:
    config = _config(replay={"enabled": True, "per_task": 2, "max_staleness": 3})
    gym = PathGym()
    task = (await gym.list_tasks())[0]
    workflow = CUAAgentWorkflow(config, gym=gym, processor=processor)
    winner = StateEngine(processor, config, first=["L"])
    winner.version = 3
    first = await workflow.arun_group(winner, {"task": task})
    assert first.replayed == 0 and any(first.root_successes)
    loser = StateEngine(processor, config, first=["R"])  # R→good, R→bad: no success
    loser.version = 5
    second = await workflow.arun_group(loser, {"task": task})
    assert second.replayed == 1 and not any(second.root_successes)
    replayed = [r for r in second.runs if r.record.replayed]
    assert len(replayed) == 1 and replayed[0].record.success
    stored = next(r for r in first.runs if r.record.success)
    assert [t.output_ids for t in replayed[0].record.turns] == [
        t.output_ids for t in stored.record.turns
    ]
    assert second.samples is not None
    n_replayed = second.replayed_rows
    versions = second.samples["versions"][-n_replayed:]
    logprobs = second.samples["logprobs"][-n_replayed:]
    trained = second.samples["loss_mask"][-n_replayed:].bool()
    assert set(versions[trained].tolist()) == {3}, "the replayed rows keep their own versions"
    assert set(
        second.samples["versions"][:-n_replayed][
            second.samples["loss_mask"][:-n_replayed].bool()
        ].tolist()
    ) == {5}
    assert logprobs[trained].tolist() == pytest.approx([-0.5] * int(trained.sum()))
    # the success lifts the failed group: its advantage is the only positive one
    assert replayed[0].record.turns[-1].reward > 0
    # four versions later it is staler than max_staleness: dropped, not replayed
    loser.version = 7
    third = await workflow.arun_group(loser, {"task": task})
    assert third.replayed == 0


async def test_dynamic_sampling_drops_groups_without_signal(processor) -> None:
    config = _config(dynamic_sampling=True)
    gym = PathGym()
    task = {"task": (await gym.list_tasks())[0]}
    workflow = CUAAgentWorkflow(config, gym=gym, processor=processor)
    # two roots at R: R→good (0.5) and R→bad (0): signal
    signal = StateEngine(processor, config, first=["R"])
    assert await workflow.arun_episode(signal, task) is not None
    # every episode taps L then good: equal rewards, no signal
    flat = StateEngine(processor, config, first=["L"], vary=False)
    outcome = await workflow.arun_group(flat, task)
    assert outcome.flat and outcome.samples is not None
    assert await workflow.arun_episode(flat, task) is None


@pytest.mark.parametrize(("threshold", "points"), [(3.9, 2), (4.1, 0)])
async def test_the_uncertainty_trigger_reads_the_action_tokens_surprisal(
    processor, threshold: float, points: int
) -> None:
    """Every token here has log-prob -0.5: the action's first 8 tokens are 4 nats surprising.
    Episodes branch when that reaches the threshold (roots never at their first turn,
    siblings never at theirs), until the group's two branch points are spent."""
    config = _config(branch={"enabled": True, "trigger": "uncertainty", "threshold": threshold})
    gym = PathGym()
    engine = StateEngine(processor, config, first=["L", "R"])
    workflow = CUAAgentWorkflow(config, gym=gym, processor=processor)
    outcome = await workflow.arun_group(engine, {"task": (await gym.list_tasks())[0]})
    assert outcome.branch.points == points
    forks = [(r.record.origin, i) for r in outcome.runs for i in r.record.branched_at]
    assert len(forks) == points
    for origin, turn in forks:
        assert turn >= 1 and (origin is None or turn > origin.turn)
    _rows_match(outcome)
