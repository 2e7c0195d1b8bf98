"""``CUAAgentWorkflow``: AReaL's ``RolloutWorkflow`` for computer-use episodes.

One dataset row is one task. ``arun_episode`` runs a GROUP of ``group_size`` episodes of it
concurrently (GRPO) and returns one training row per turn (see ``cua_native.rollout.trajectory`` for the
format and the per-episode reward normalisation), or ``None`` to reject the group.

Run it with AReaL's rollout ``group_size`` = 1 (``gconfig.n_samples`` of the rollout call = 1):
the group lives here, so a failed episode can never shrink a group and shift AReaL's
normalisation (the predecessor's bug). An episode that fails for infrastructure reasons is
retried on a fresh execution; if it fails again the whole group is rejected.

The workflow is built from plain, serializable kwargs (AReaL may construct it in a rollout
worker from an import path + ``workflow_kwargs``); the gym client, processor and prompt builder
are created lazily on first use, once per running event loop.

Credit switches (``AgentConfig.credit``, all off by default; ``docs/contracts.md#per-step-credit``):
branching rollouts fork episodes into same-state siblings (``rollout/branching.py``) and the
rows carry per-turn advantages of the tree of siblings; anchor-state groups add GiGPO's
step-level advantage (``rollout/credit.py``); success replay mixes a stored success into a
group without one (``rollout/replay.py``); dynamic sampling returns ``None`` for a group whose
advantages are all 0 (AReaL's executor then draws another task). ``arun_group`` is the one
implementation; ``arun_episode`` is AReaL's view of it. The same code runs in the embedded
trainer and in AReaL's rollout workers.

On an AReaL remote engine (the cluster path) ``arun_episode`` first installs
``cua_native.engine.remote``'s backend: each turn's prompt is checked against what the server
reports (a mismatch rejects the episode as ``token_mismatch``), and a vLLM chat turn aborted by
a weight update is restarted under the new weights rather than concatenated. A rollout worker's
engine also gets its configured staleness limits back (``cua_native.engine.capacity``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import torch
from areal import workflow_context
from areal.api.workflow_api import RolloutWorkflow
from areal.utils import stats_tracker
from areal.utils.dynamic_import import import_from_string

from cua_native.engine.capacity import keep_configured_limits
from cua_native.engine.remote import prepare_remote_engine
from cua_native.gym.protocol import Gym, Task
from cua_native.rollout.agent import Agent
from cua_native.rollout.branching import Brancher, BranchTally
from cua_native.rollout.config import AgentConfig
from cua_native.rollout.credit import OrphanBranch
from cua_native.rollout.episode import Engine, Episode, EpisodeRun, run_with_retry
from cua_native.rollout.factories import (
    load_processor,
    make_agent,
    make_gym,
    media_client,
    model_dtype,
    resolve_model_path,
)
from cua_native.rollout.pause_clock import PauseClock, engine_pause_probe
from cua_native.rollout.records import EpisodeContext, EpisodeObserver, NullObserver
from cua_native.rollout.replay import ReplayBuffer
from cua_native.rollout.shared import PROCESS_RESOURCES
from cua_native.rollout.trajectory import (
    VisionTokens,
    credit_rewards,
    group_samples,
    is_uniform_group,
)

logger = logging.getLogger(__name__)

STAT_PREFIX = "cua"


def task_from_row(data: dict[str, Any]) -> Task:
    """The task of a dataset row: the full ``task`` JSON when present, else the row's fields."""
    raw = data.get("task")
    if isinstance(raw, str) and raw:
        return Task.model_validate_json(raw)
    if isinstance(raw, dict):
        return Task.model_validate(raw)
    if isinstance(raw, Task):
        return raw
    if not data.get("task_id"):
        raise ValueError("dataset row has neither 'task' nor 'task_id'")
    fields = {k: v for k, v in data.items() if k in Task.model_fields and v is not None}
    return Task.model_validate(fields)


@dataclass(slots=True)
class _Resources:
    loop: asyncio.AbstractEventLoop
    gym: Gym
    owns_gym: bool
    agent: Agent
    tokens: VisionTokens
    observer: EpisodeObserver
    pixel_dtype: torch.dtype | None = None
    """The model's dtype: training rows carry pixels in it (half of float32 for bf16)."""
    owns_observer: bool = False
    clocks: dict[int, PauseClock] = field(default_factory=dict)
    http: httpx.AsyncClient | None = None
    """The prompt builder's client for screenshot URLs (``factories.media_client``), or None."""
    replay: ReplayBuffer | None = None
    """The process's success buffer (``credit.replay``) when the caller gave none."""

    def clock_for(self, engine: Any) -> Callable[[], float]:
        """The episodes' clock for ``engine``: it stands still while the trainer holds the
        engine's rollout paused (``PauseClock``); plain monotonic time for engines never paused."""
        probe = engine_pause_probe(engine)
        if probe is None:
            return time.monotonic
        clock = self.clocks.get(id(engine))
        if clock is None:
            clock = self.clocks[id(engine)] = PauseClock(probe)
        clock.start()
        return clock

    async def aclose(self) -> None:
        """Stop the clocks, close the gym client and the recorder this set created."""
        for clock in self.clocks.values():
            await clock.aclose()
        self.clocks.clear()
        if self.http is not None:
            await self.http.aclose()
        if self.owns_gym:
            await self.gym.aclose()
        if self.owns_observer:
            await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """What can be closed without the event loop: the recorder's thread."""
        close = getattr(self.observer, "close_in_thread", None)
        if self.owns_observer and callable(close):
            close()


FLAT_EPS = 1e-6
"""A group whose rows' advantages are all within this of 0 carries no signal."""


@dataclass(slots=True)
class GroupOutcome:
    """A group's rows (``None``: rejected, or no turns) and what the credit switches did."""

    samples: dict[str, Any] | None
    rejected: bool = False
    """An infrastructure fault rejected it: no rows."""
    uniform: bool = False
    """Its episodes all earned the same reward (``trajectory.is_uniform_group``); with
    ``skip_uniform_groups`` its rows are never built."""
    flat: bool = False
    """Every row's advantage is 0 (uniform groups are): no gradient (``credit.dynamic_sampling``
    drops it)."""
    runs: list[EpisodeRun] = field(default_factory=list)
    branch: BranchTally = field(default_factory=BranchTally)
    replayed: int = 0
    """Replayed episodes mixed in (``credit.replay``)."""
    replayed_rows: int = 0
    anchor_groups: int = 0

    @property
    def env_steps(self) -> int:
        """Environment steps the group played (model turns of played episodes, siblings
        included; replayed episodes cost none)."""
        return sum(len(r.record.turns) for r in self.runs if not r.record.replayed)

    @property
    def root_successes(self) -> list[bool]:
        """Success of each played root episode (what plain GRPO would have played)."""
        return [
            r.record.success for r in self.runs if r.record.origin is None and not r.record.replayed
        ]


class CUAAgentWorkflow(RolloutWorkflow):
    """Groups of computer-use episodes → per-turn AReaL training rows."""

    def __init__(
        self,
        config: AgentConfig | dict[str, Any] | None = None,
        *,
        source: Literal["step", "eval", "baseline"] = "step",
        observer_factory: str | None = None,
        gym: Gym | None = None,
        processor: Any = None,
        observer: EpisodeObserver | None = None,
        skip_uniform_groups: bool = False,
        replay: ReplayBuffer | None = None,
        compact_pixels: bool = False,
    ) -> None:
        """``config`` and ``observer_factory`` (an import path of a zero-argument callable that
        returns an ``EpisodeObserver``) are serializable; ``gym``, ``processor`` and ``observer``
        let in-process callers share live objects (the caller then owns and closes the gym).
        ``skip_uniform_groups``: a uniform group (``trajectory.is_uniform_group``) gives no
        rows (``cua.skip_uniform_groups``). ``replay`` is the success buffer of
        ``credit.replay`` (default: one per process and config, shared by AReaL's workflow
        objects). ``compact_pixels``: rows carry their screenshots as uint8 palette indices
        (``pixel_palette``), for rows that cross AReaL's process boundary; the actor expands
        them (``CUAFSDPPPOActor``)."""
        self._given_replay = replay
        self.config = (
            config if isinstance(config, AgentConfig) else AgentConfig.model_validate(config or {})
        )
        self.source = source
        self.observer_factory = observer_factory
        self.skip_uniform_groups = skip_uniform_groups
        self.compact_pixels = compact_pixels
        self._given_gym = gym
        self._given_processor = processor
        self._given_observer = observer
        self._setup: tuple[asyncio.AbstractEventLoop, asyncio.Task[_Resources]] | None = None

    async def _resources(self) -> _Resources:
        if (
            self._given_gym is None
            and self._given_processor is None
            and self._given_observer is None
        ):
            # built from serializable kwargs (AReaL's workers): one set per process and loop
            key = (self.config.model_dump_json(), self.observer_factory)
            loop = asyncio.get_running_loop()
            resources: _Resources = await PROCESS_RESOURCES.get(
                key, lambda: self._create_resources(loop)
            )
            return resources
        loop = asyncio.get_running_loop()
        if self._setup is None or self._setup[0] is not loop:
            self._setup = (loop, loop.create_task(self._create_resources(loop)))
        setup = self._setup[1]
        try:
            return await asyncio.shield(setup)
        except Exception:
            if self._setup is not None and self._setup[1] is setup:
                self._setup = None  # let the next call try again
            raise

    async def _create_resources(self, loop: asyncio.AbstractEventLoop) -> _Resources:
        processor = self._given_processor
        model_path = await asyncio.to_thread(resolve_model_path, self.config.model_path)
        if processor is None:
            processor = await asyncio.to_thread(load_processor, model_path)
        http = media_client(self.config.gym)
        agent = make_agent(self.config, processor, http=http)
        observer = self._given_observer
        if observer is None and self.observer_factory:
            observer = import_from_string(self.observer_factory)()
        gym = self._given_gym if self._given_gym is not None else make_gym(self.config.gym)
        return _Resources(
            loop=loop,
            gym=gym,
            owns_gym=self._given_gym is None,
            agent=agent,
            tokens=VisionTokens.from_tokenizer(agent.tokenizer),
            observer=observer or NullObserver(),
            pixel_dtype=model_dtype(model_path),
            owns_observer=self._given_observer is None and observer is not None,
            http=http,
            replay=ReplayBuffer(self.config.credit.replay),
        )

    async def aclose(self) -> None:
        """Release the gym client this workflow created (if any) on the current loop."""
        setup, self._setup = self._setup, None
        if setup is None or setup[0] is not asyncio.get_running_loop() or not setup[1].done():
            return
        if setup[1].exception() is None:
            await setup[1].result().aclose()

    async def arun_episode(self, engine: Engine, data: dict[str, Any]) -> dict[str, Any] | None:
        """AReaL's entry: ``arun_group``'s rows, ``None`` for a rejected group and, with
        ``credit.dynamic_sampling``, for a group without signal."""
        outcome = await self.arun_group(engine, data)
        if outcome.flat and self.config.credit.dynamic_sampling:
            return None
        return outcome.samples

    async def arun_group(self, engine: Engine, data: dict[str, Any]) -> GroupOutcome:
        """Run one task's group (with the credit switches) and build its training rows."""
        # AReaL's remote clients: prompt checks, and vLLM chat turns restarted (not
        # concatenated) when a weight update aborts them; idempotent, other engines untouched
        prepare_remote_engine(engine)
        # a controller-managed worker's staleness limits stay the configured ones (AReaL #1471)
        keep_configured_limits(engine)
        resources = await self._resources()
        task = task_from_row(data)
        tally = BranchTally()
        runs = await self.run_group(engine, task, resources, data, tally)
        tracker = stats_tracker.get(workflow_context.stat_scope())
        if runs is None:
            return GroupOutcome(None, rejected=True, branch=tally)
        record_group_stats(tracker, runs)
        config = self.config
        credit = config.credit
        outcome = GroupOutcome(None, runs=runs, branch=tally)
        if credit.replay.enabled:
            replay = self._given_replay or resources.replay
            assert replay is not None
            if not any(outcome.root_successes):
                stored = replay.take(task.task_id, _engine_version(engine))
                if stored is not None:
                    runs.append(stored)
                    outcome.replayed = 1
                    outcome.replayed_rows = len(stored.record.turns)
            for run in runs:
                replay.add(run)
        # every episode (siblings and replays included) earned the same reward: every turn's
        # advantage is 0 under any credit rule, so the pixel rows need not be built to know it
        outcome.uniform = is_uniform_group(
            [run.record.reward for run in runs],
            normalize=config.group_reward_norm,
            eps=config.reward_norm_eps,
        )
        if outcome.uniform:
            tracker.scalar(**{f"{STAT_PREFIX}/uniform_groups": 1.0})
            if self.skip_uniform_groups:
                outcome.flat = True
                return outcome
        # Megabytes of tensors per group (each turn's row carries its prompt's pixel values):
        # off the event loop, like the rest of the per-turn CPU work.
        outcome.samples = await asyncio.to_thread(self._rows, runs, resources, outcome)
        samples = outcome.samples
        if samples is None:
            tracker.scalar(**{f"{STAT_PREFIX}/rejected_groups/no_turns": 1.0})
            return outcome
        outcome.flat = outcome.uniform or not bool(samples["rewards"].abs().max() > FLAT_EPS)
        if credit.any:
            tracker.scalar(
                **{
                    f"{STAT_PREFIX}/credit/flat_groups": float(outcome.flat),
                    f"{STAT_PREFIX}/credit/branch_points": float(tally.points),
                    f"{STAT_PREFIX}/credit/extra_env_steps": float(tally.extra_turns),
                    f"{STAT_PREFIX}/credit/replayed_samples": float(outcome.replayed_rows),
                }
            )
        return outcome

    def _rows(
        self, runs: list[EpisodeRun], resources: _Resources, outcome: GroupOutcome
    ) -> dict[str, Any] | None:
        """The group's rows; their rewards are ``credit_rewards``' per-turn advantages when
        branching or anchors are on (``outcome.anchor_groups`` set), else the episodes'."""
        config = self.config
        gamma, normalize, eps = (
            config.turn_discount,
            config.group_reward_norm,
            config.reward_norm_eps,
        )
        rewards = None
        if config.credit.branch.enabled or config.credit.anchor.enabled:
            rewards, outcome.anchor_groups = credit_rewards(
                runs, gamma=gamma, normalize=normalize, eps=eps, credit=config.credit
            )
        return group_samples(
            runs,
            resources.tokens,
            gamma=gamma,
            normalize=normalize,
            eps=eps,
            pixel_dtype=resources.pixel_dtype,
            rewards=rewards,
            compact_pixels=self.compact_pixels,
        )

    async def play_group(
        self, engine: Engine, task: Task, data: dict[str, Any]
    ) -> list[EpisodeRun] | None:
        """``run_group`` on this workflow's resources: the group runner for callers other than
        AReaL (slime's rollout function, the rollout buffer), which turn the runs into their
        own samples."""
        return await self.run_group(engine, task, await self._resources(), data)

    def _step_of(self, version: int) -> int | None:
        """Training rollouts belong to the step whose weights made them (version N = after N
        updates = step N); AReaL evaluates step N after its update (version N + 1); the
        baseline belongs to no step."""
        if self.source == "step":
            return version
        if self.source == "eval":
            return max(version - 1, 0)
        return None

    async def run_group(
        self,
        engine: Engine,
        task: Task,
        resources: _Resources,
        data: dict[str, Any],
        branch_tally: BranchTally | None = None,
    ) -> list[EpisodeRun] | None:
        """Run the group; ``None`` if any episode failed for infrastructure reasons twice (the
        others are cancelled at once, their executions closed). With ``credit.branch`` the
        episodes may fork into siblings, which run alongside and come after the roots."""
        tracker = stats_tracker.get(workflow_context.stat_scope())
        group_id = uuid.uuid4().hex
        version = _engine_version(engine)

        def on_reject(run: EpisodeRun) -> None:
            tracker.scalar(**{f"{STAT_PREFIX}/rejected_episodes/{run.record.reject_reason}": 1.0})

        def context_factory(index: int) -> Any:
            def make(attempt: int) -> EpisodeContext:
                return EpisodeContext(
                    task=task,
                    group_id=group_id,
                    attempt=attempt,
                    source=self.source,
                    # AReaL's rows carry no step: the step whose weights generate this
                    # episode is the engine's version (step N's update sets version N + 1)
                    step=data.get("global_step", self._step_of(version)),
                    model_version=version,
                    meta={"index_in_group": index},
                )

            return make

        spawned: list[asyncio.Future[EpisodeRun]] = []
        pending: dict[asyncio.Future[EpisodeRun], int] = {}

        def sibling_context(parent: EpisodeContext, turn: int) -> EpisodeContext:
            return EpisodeContext(
                task=task,
                group_id=group_id,
                source=self.source,
                step=parent.step,
                model_version=parent.model_version,
                meta={
                    "index_in_group": self.config.group_size + len(spawned),
                    "parent_episode": parent.episode_id,
                    "branch_turn": turn,
                },
            )

        def spawn(episode: Episode) -> None:
            future = asyncio.ensure_future(episode.run())
            # cancelled before it ran, the sibling never reaches its own ``finally``
            future.add_done_callback(functools.partial(_close_if_cancelled, episode=episode))
            pending[future] = self.config.group_size + len(spawned)
            spawned.append(future)

        brancher = (
            Brancher(
                self.config.credit.branch,
                spawn,
                sibling_context,
                fork_timeout_s=self.config.turn_timeout_s,
                tally=branch_tally if branch_tally is not None else BranchTally(),
            )
            if self.config.credit.branch.enabled and self.source == "step"
            else None
        )
        for index in range(self.config.group_size):
            future: asyncio.Future[EpisodeRun] = asyncio.ensure_future(
                run_with_retry(
                    gym=resources.gym,
                    task=task,
                    engine=engine,
                    agent=resources.agent,
                    make_context=context_factory(index),
                    observer=resources.observer,
                    on_reject=on_reject,
                    clock=resources.clock_for(engine),
                    branch=brancher,
                )
            )
            pending[future] = index
        finished: dict[int, EpisodeRun] = {}
        try:
            waiting: set[asyncio.Future[EpisodeRun]] = set(pending)
            handled: set[asyncio.Future[EpisodeRun]] = set()
            while waiting:
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    run = future.result()
                    if run.rejected:
                        reason = run.record.reject_reason or "unknown"
                        tracker.scalar(**{f"{STAT_PREFIX}/rejected_groups/{reason}": 1.0})
                        logger.warning(
                            "group %s of %s rejected: %s", group_id, task.task_id, reason
                        )
                        return None
                    finished[pending[future]] = run
                    if brancher is not None:
                        brancher.count(run)
                    handled.add(future)
                # siblings spawned meanwhile (by episodes still running or just finished)
                waiting |= set(spawned) - handled
        finally:
            await _cancel_all(pending)
        runs = [finished[i] for i in sorted(finished)]
        if brancher is not None:
            ids = {r.record.context.episode_id for r in runs}
            orphans = [r for r in runs if r.record.origin and r.record.origin.parent_id not in ids]
            if orphans:  # a parent was retried after it branched: its siblings' tree is gone
                tracker.scalar(**{f"{STAT_PREFIX}/rejected_groups/{OrphanBranch.__name__}": 1.0})
                return None
        return runs


def _close_if_cancelled(future: asyncio.Future[EpisodeRun], episode: Episode) -> None:
    """Close a sibling's forked execution when its run was cancelled (idempotent: a run that
    started closed it already)."""
    if future.cancelled() and episode.execution is not None:
        closing = asyncio.ensure_future(episode.execution.close())
        closing.add_done_callback(lambda done: done.cancelled() or done.exception())


async def _cancel_all(futures: Sequence[asyncio.Future[Any]] | dict[Any, Any]) -> None:
    """Cancel what still runs and wait for it (each episode closes its execution)."""
    live = [f for f in futures if not f.done()]
    for future in live:
        future.cancel()
    if live:
        await asyncio.gather(*live, return_exceptions=True)


def _engine_version(engine: Any) -> int:
    get_version = getattr(engine, "get_version", None)
    try:
        return int(get_version()) if callable(get_version) else 0
    except Exception:
        return 0


def record_group_stats(tracker: Any, runs: Sequence[EpisodeRun]) -> None:
    """Per-episode figures under ``cua/``: reward, success, turns, parse errors by kind, seconds
    per phase, token mismatches, turns whose prompt a remote server reported and was checked
    (``prompt_checks``), end reasons."""
    for run in runs:
        record = run.record
        figures = record.figures()
        values: dict[str, float] = {
            "reward": figures.reward,
            "success": float(figures.success),
            "turns": float(figures.turns),
            "token_mismatches": float(figures.token_mismatches),
            "prompt_checks": float(figures.prompt_checks),
            "attempts": float(record.context.attempt + 1),
            f"end/{record.end_reason or 'unknown'}": 1.0,
        }
        values.update({f"parse_errors/{k}": float(n) for k, n in figures.parse_errors.items()})
        values.update({f"time/{phase}": seconds for phase, seconds in record.timings.items()})
        tracker.scalar(**{f"{STAT_PREFIX}/{key}": value for key, value in values.items()})


def workflow_kwargs(config: AgentConfig, **extra: Any) -> dict[str, Any]:
    """Serializable ``workflow_kwargs`` for AReaL (``workflow="cua_native.rollout.workflow.CUAAgentWorkflow"``)."""
    return {"config": json.loads(config.model_dump_json()), **extra}
