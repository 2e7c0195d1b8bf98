"""slime's rollout function running the CUA episode loop in process.

    --rollout-function-path cua_native.slime.rollout.generate_rollout

``generate_rollout(args, rollout_id, data_source, evaluation=False)`` is the signature slime's
``RolloutManager`` calls at the pinned commit (``slime/ray/rollout.py``, through
``slime/rollout/base_types.py``'s ``call_rollout_fn``). It takes ``--rollout-batch-size`` prompt
groups from slime's ``data_source`` (each row's ``metadata`` holds the task, as
``python -m cua_native.slime tasks`` writes them), plays each as one GRPO group of
``--n-samples-per-prompt`` episodes with the AReaL path's own group runner
(``CUAAgentWorkflow.play_group``: the same prompt builders, parsers, gyms, infra retries, and a
group dropped whole when an episode is rejected again), generating through slime's SGLang router
with the AReaL SGLang path's requests (``cua_native.slime.engine``), and returns
``RolloutFnTrainOutput(samples=prompt × episode × turn)`` of slime ``Sample``s
(``cua_native.slime.samples``). A dropped group is replaced by the data source's next prompt, so
slime always gets ``--rollout-batch-size`` complete groups; so is a group with an episode that
ended before its first turn (no sample to train on, and slime's steps count rollouts).

The loop's state (the workflow's gym client, processor and recorder, the engine's HTTP client)
lives on ``args`` (``RUNTIME_ATTR``; it does not travel when ``args`` is pickled), the one
object slime hands every call; coroutines run on slime's own background event loop
(``slime.utils.async_utils.run``), as its rollout functions do.
``shutdown(args)`` releases it all. Episodes go to the Training Monitor the config names
(``cua.monitor_db`` / ``cua.monitor_url``), ``step`` = ``rollout_id``.

Evaluation (``evaluation=True``) is not served here (slime's own agent rollout refuses it too):
evaluate a checkpoint with ``python -m cua_native.evaluate``.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from cua_native.monitor.client.recorder import recorder_from_config
from cua_native.rollout.episode import EpisodeRun
from cua_native.rollout.records import EpisodeObserver
from cua_native.rollout.workflow import CUAAgentWorkflow, task_from_row
from cua_native.slime.engine import RouterEngine
from cua_native.slime.samples import group_turn_samples
from cua_native.slime.settings import SlimeArgsError, SlimeSetup, setup_from_args

RUNTIME_ATTR = "_cua_slime_runtime"

T = TypeVar("T")


def _slime(module: str) -> Any:
    """A module of slime (present wherever slime calls this package)."""
    return importlib.import_module(module)


@dataclass
class SlimeRollout:
    """The loop's live objects for one slime run."""

    setup: SlimeSetup
    engine: RouterEngine
    workflow: CUAAgentWorkflow
    observer: EpisodeObserver | None = None

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        """The live objects stay in this process: a pickled or copied ``args`` (slime ships its
        arguments to Ray actors) carries ``None`` in their place."""
        return (_left_behind, ())

    @classmethod
    def create(cls, setup: SlimeSetup, observer: EpisodeObserver | None = None) -> SlimeRollout:
        engine = RouterEngine(setup.router_url, timeout_s=setup.agent.turn_timeout_s)
        workflow = CUAAgentWorkflow(setup.agent, source="step", observer=observer)
        return cls(setup=setup, engine=engine, workflow=workflow, observer=observer)

    async def play(self, template: Any, rollout_id: int) -> list[EpisodeRun] | None:
        """One prompt group: the task in the prompt sample's ``metadata``, ``group_size``
        episodes; ``None`` if the group was dropped (or an episode has no turn)."""
        task = task_from_row(template.metadata or {})
        runs = await self.workflow.play_group(self.engine, task, {"global_step": rollout_id})
        if runs is None or any(not run.record.turns for run in runs):
            return None
        return runs

    async def rollout(
        self, rollout_id: int, data_source: Any, batch: int
    ) -> tuple[list[Any], dict[str, Any]]:
        """``batch`` complete groups as ``prompt × episode × turn`` samples, and the figures
        of the groups dropped on the way."""
        sample_cls = _slime("slime.utils.types").Sample
        agent = self.setup.agent
        done: list[Any] = []
        dropped = 0
        pending: dict[asyncio.Task[list[EpisodeRun] | None], list[Any]] = {}

        def submit(count: int) -> None:
            for group in data_source.get_samples(count):
                if len(group) != agent.group_size:
                    raise SlimeArgsError(
                        f"the data source gave a group of {len(group)}, the loop plays "
                        f"--n-samples-per-prompt = {agent.group_size}"
                    )
                pending[asyncio.ensure_future(self.play(group[0], rollout_id))] = group

        submit(batch)
        try:
            while pending:
                finished, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for future in finished:
                    group = pending.pop(future)
                    runs = future.result()
                    if runs is None:
                        dropped += 1
                        submit(1)
                        continue
                    done.append(
                        group_turn_samples(
                            sample_cls,
                            runs,
                            group,
                            gamma=agent.turn_discount,
                            normalize=agent.group_reward_norm,
                            eps=agent.reward_norm_eps,
                        )
                    )
        finally:
            for future in pending:
                future.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        done.sort(key=lambda groups: groups[0][0].index)
        return done, {"cua/dropped_groups": dropped}

    async def aclose(self) -> None:
        await self.workflow.aclose()
        await self.engine.aclose()


def _left_behind() -> None:
    return None


def runtime(args: Any) -> SlimeRollout:
    """The run's ``SlimeRollout``, made on first use from ``args`` (checked first: one
    ``SlimeArgsError``/``ConfigError`` line) and kept on ``args``."""
    existing = getattr(args, RUNTIME_ATTR, None)
    if isinstance(existing, SlimeRollout):
        return existing
    setup = setup_from_args(args)
    cua = setup.cua
    observer = None
    if cua.monitor_db_url() or cua.monitor_url:
        recorder = recorder_from_config(
            cua.monitor_db_url(),
            cua.monitor_url,
            cua.monitor_token,
            cua.run_dir,
            model_path=setup.agent.model_path or "",
        )
        recorder.start_in_thread()
        observer = recorder
    made = SlimeRollout.create(setup, observer)
    setattr(args, RUNTIME_ATTR, made)
    return made


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``coro`` on slime's background event loop (what slime's own rollout functions use)."""
    result: T = _slime("slime.utils.async_utils").run(coro)
    return result


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout function (see the module docstring)."""
    if evaluation:
        raise NotImplementedError(
            "the CUA loop serves slime's training rollouts only; evaluate with "
            "python -m cua_native.evaluate"
        )
    loop = runtime(args)
    groups, metrics = run(loop.rollout(rollout_id, data_source, int(args.rollout_batch_size)))
    output = _slime("slime.rollout.base_types").RolloutFnTrainOutput
    return output(samples=groups, metrics=metrics)


def shutdown(args: Any) -> None:
    """Release what ``runtime`` made for ``args``: gym client, HTTP client, recorder."""
    made = getattr(args, RUNTIME_ATTR, None)
    if not isinstance(made, SlimeRollout):
        return
    delattr(args, RUNTIME_ATTR)
    run(made.aclose())
    close = getattr(made.observer, "close_in_thread", None)
    if callable(close):
        close()
