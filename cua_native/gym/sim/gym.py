"""``SimGym``: the embedded simulated phone behind the async ``Gym`` protocol (gym id ``sim``).

Each execution owns its own seeded ``PhoneState``; the renderer (fonts, icons) is shared per
gym. Applying an action and rendering a 1080×2400 frame take a few milliseconds of Pillow
work, which runs in a worker thread (or the executor given), never on the event loop.

``screenshot_size`` renders screenshots at another size than the screen (as a phone that
returns scaled screenshots); coordinates stay those of the ``width`` × ``height`` screen. Set
to the size the model sees (``smart_resize`` of the screen for its pixel budget), the prompt
builder has nothing to resize and the model gets the same geometry, drawn directly: a 160×384
frame renders in a third of the time of a 1080×2400 one and holds 0.18 MB instead of 7.8 MB.

``progress_reward`` (default 0: the reward is the gym spec's, ``reward_from_result``: 1 for a
success, a failure the weighted share of its validators that passed) gives failed episodes
credit for the share of the task's solution path they covered (``gym.sim.progress``): reward =
1 for a success, else the larger of the validators' share and ``progress_reward`` × progress. ``Evaluation.success`` is the validators'
verdict either way, and ``Evaluation.raw["progress"]`` reports the progress when it is on.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import random
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

from PIL import Image

from cua_native.actions import models as m
from cua_native.actions.coords import PixelSpace
from cua_native.gym.protocol import (
    Evaluation,
    ExecutionGone,
    GymError,
    Observation,
    Screenshot,
    StepResult,
    Task,
    reward_from_result,
)
from cua_native.gym.sim.execute import Phone
from cua_native.gym.sim.progress import progress, shaped_reward, solution_distance
from cua_native.gym.sim.render import Renderer
from cua_native.gym.sim.screens import build_layout, screen_for
from cua_native.gym.sim.solver import SwipeStyle, next_step
from cua_native.gym.sim.state import PhoneState, new_state
from cua_native.gym.sim.tasks import apply_setup, catalogue, validate

_T = TypeVar("_T")

DEFAULT_USER_REPLY = "No further information. Please continue with the task."


def parse_size(text: str) -> tuple[int, int]:
    """``"160x384"`` → ``(160, 384)`` (command-line screenshot sizes); ``ValueError`` else."""
    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"a size is WIDTHxHEIGHT, e.g. 160x384; got {text!r}") from None
    return width, height


REWARD_OPTIONS = frozenset({"progress_reward"})
"""``SimGym`` options that shape rewards only: screenshots, tasks and solutions are the same
without them (demonstrations leave them out, and a warm start's cache key ignores them)."""


class UnknownTask(GymError, LookupError):
    """The simulator has no task with that id."""


class SimExecution:
    """One live simulated phone running one task."""

    def __init__(
        self,
        gym: SimGym,
        execution_id: str,
        task: Task,
        state: PhoneState,
        user_reply: str,
        start_distance: int | None = None,
        seed: int = 0,
    ) -> None:
        self.gym = gym
        self.seed = seed
        """The phone's seed (a fork keeps it: its id names the same phone)."""
        self.start_distance = start_distance
        """The solution's length from the initial state (``progress_reward`` on), else None."""
        self.execution_id = execution_id
        self.task = task
        self.state = state
        self.phone = Phone(state, PixelSpace(gym.width, gym.height), user_reply)
        self._frame: Image.Image | None = None
        self._closed = False
        self._lock = asyncio.Lock()

    def _check(self) -> None:
        if self._closed:
            raise ExecutionGone(f"execution {self.execution_id} is closed")

    def _render(self) -> Image.Image:
        if self._frame is None:
            self._frame = self.gym.renderer.render(self.state, build_layout(self.state))
        return self._frame

    def _observation(self) -> Observation:
        return Observation(
            Screenshot(image=self._render()), self.gym.width, self.gym.height, turn=self.state.turn
        )

    async def observe(self) -> Observation:
        async with self._lock:
            self._check()
            if self._frame is not None:  # rendered by the last act: no thread hop
                return self._observation()
            return await self.gym.offload(self._observation)

    def _act(self, action: m.Action) -> StepResult:
        """Apply the action and render the screen it leads to, in one off-loop call: the
        loop's next prompt needs that screenshot, and a separate ``observe`` would cost a
        second thread hand-off per turn."""
        outcome = self.phone.apply(action)
        self._frame = None
        return StepResult(
            ok=outcome.ok,
            error=outcome.error,
            feedback=outcome.feedback,
            observation=self._observation(),
        )

    async def act(self, action: m.Action) -> StepResult:
        async with self._lock:
            self._check()
            return await self.gym.offload(self._act, action)

    async def evaluate(self, answer: str | None = None) -> Evaluation:
        async with self._lock:
            self._check()
            given = answer if answer is not None else self.state.answer
            validators = tuple(validate(self.task, self.state, given))
            success = bool(validators) and all(v.passed for v in validators)
            result: dict[str, Any] = {
                "success": success,
                "validators": [v.to_json() for v in validators],
            }
            reward = reward_from_result(result, success)
            if self.start_distance is not None:
                if success:  # the path's end, whichever way it was reached
                    covered = 1.0
                else:
                    end = await self.gym.offload(self._distance)
                    covered = progress(self.start_distance, end)
                result["progress"] = covered
                reward = shaped_reward(success, covered, self.gym.progress_reward, reward)
            return Evaluation(
                reward=reward,
                success=success,
                validators=validators,
                raw=result,
            )

    async def fork(self) -> SimExecution:
        """A new execution of the same task in exactly this state (a deep copy of the phone:
        settings, app data, navigation stack, menu, pointer, turn counter); it continues as
        this one would on the same actions. Waits for an ``act`` in flight."""
        async with self._lock:
            self._check()
            state = copy.deepcopy(self.state)
            return self.gym._register(self.task, state, self.start_distance, self.seed)

    def _distance(self) -> int:
        return solution_distance(self.task, self.state, self.phone.space)

    def solution_step(
        self, swipe_style: SwipeStyle = "direction"
    ) -> tuple[m.Action, str | None] | None:
        """The next action of the task's known solution on the current screen and the label of
        the element it touches (``None`` if none), or ``None`` when the solution is complete
        (for demonstrations and tests). Cheap (a layout build), so it runs inline; do not call
        it while an ``act`` of this execution is in flight."""
        self._check()
        return next_step(self.task, self.state, build_layout(self.state), swipe_style)

    async def play_solution(self, swipe_style: SwipeStyle = "direction") -> list[m.Action]:
        """Act the whole solution path, ending with its ``answer``/``terminate``; returns the
        actions taken. Raises ``GymError`` if the path is refused or longer than the task's
        ``max_steps``."""
        taken: list[m.Action] = []
        limit = self.task.max_steps or 30
        while len(taken) < limit:
            step = self.solution_step(swipe_style)
            action = step[0] if step is not None else m.Terminate(status="success")
            result = await self.act(action)
            if not result.ok:
                raise GymError(f"{self.task.task_id}: solution action {action!r} refused")
            taken.append(action)
            if action.type in m.EPISODE_ENDING:
                return taken
        raise GymError(f"{self.task.task_id}: the solution path is longer than {limit} steps")

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._frame = None
            self.gym._live.pop(self.execution_id, None)


class SimGym:
    """The simulated phone as a gym: ``list_tasks``, ``start(task)`` → ``SimExecution``."""

    gym_id = "sim"
    can_fork = True
    """Its executions copy their state (``SimExecution.fork``); the gym server advertises it."""

    async def replays_exactly(self) -> bool:
        """Yes (``ReplayableGym``): an execution's phone follows from its task and seed alone,
        and an action's effect from the phone's state; nothing reads a clock or a random
        stream after the start."""
        return True

    def __init__(
        self,
        seed: int = 0,
        width: int = 1080,
        height: int = 2400,
        executor: Executor | None = None,
        user_reply: str = DEFAULT_USER_REPLY,
        screenshot_size: tuple[int, int] | list[int] | None = None,
        progress_reward: float = 0.0,
    ) -> None:
        shot_w, shot_h = screenshot_size if screenshot_size is not None else (width, height)
        if min(shot_w, shot_h) < 32 or max(shot_w, shot_h) > 8192:
            raise ValueError(
                f"screenshot_size must be two integers between 32 and 8192, got {screenshot_size!r}"
            )
        if not 0.0 <= progress_reward < 1.0:
            raise ValueError(
                f"progress_reward must be in [0, 1) (a success is worth 1), got {progress_reward!r}"
            )
        self.progress_reward = float(progress_reward)
        self.seed = seed
        self.width, self.height = width, height
        self.executor = executor
        self.user_reply = user_reply
        self.screenshot_size = (int(shot_w), int(shot_h))
        self.renderer = Renderer(*self.screenshot_size)
        self._tasks = {t.task_id: t for t in catalogue()}
        self._ids = itertools.count(1)
        self._live: dict[str, SimExecution] = {}

    async def offload(self, fn: Callable[..., _T], *args: Any) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, fn, *args)

    @property
    def live_executions(self) -> int:
        return len(self._live)

    async def list_tasks(self) -> list[Task]:
        return [t.model_copy(deep=True) for t in self._tasks.values()]

    async def get_task(self, task_id: str) -> Task:
        try:
            return self._tasks[task_id].model_copy(deep=True)
        except KeyError:
            raise UnknownTask(
                f"the simulator has no task {task_id!r} (it has sim-001 … "
                f"sim-{len(self._tasks):03d})"
            ) from None

    def new_execution(self, task: Task, options: dict[str, Any] | None = None) -> SimExecution:
        """Create an execution synchronously (tests, demonstrations, the HTTP server)."""
        seed = self._seed(options, task)
        return self._register(*self._prepare(task, seed), seed)

    def _prepare(self, task: Task, seed: int) -> tuple[Task, PhoneState, int | None]:
        """The task, its initial state and (``progress_reward`` on) the solution's length."""
        known, state = self._initial_state(task, seed)
        if not self.progress_reward:
            return known, state, None
        space = PixelSpace(self.width, self.height)
        return known, state, solution_distance(known, state, space)

    def _initial_state(self, task: Task, seed: int) -> tuple[Task, PhoneState]:
        """The seeded phone, set up as the task starts (pure; a millisecond or two of CPU,
        which ``start`` runs off the event loop). The phone's data depends on the seed alone:
        every task on one phone starts from the same battery, contacts and notes, and differs
        only in what its ``setup`` pins. Seeding it by task as well gave each task on a phone
        its own status bar, which a policy could read instead of the instruction
        (bench/experiments/results/one-phone-per-seed/README.md#one-phone-per-seed)."""
        known = self._tasks.get(task.task_id)
        if known is None:
            raise UnknownTask(f"the simulator has no task {task.task_id!r}")
        rng = random.Random(f"phone:{seed}")
        state = new_state(rng)

        def open_page(target: str) -> None:
            app, _, page = target.partition(":")
            root = screen_for(app, "main" if app in ("settings", "clock") else "list")
            state.stack = [state.stack[0], root]
            if page and page != root.page:
                state.stack.append(screen_for(app, page))

        apply_setup(state, known, open_page)
        return known, state

    def _seed(self, options: dict[str, Any] | None, task: Task) -> int:
        """``options.seed``, else the task's own ``gym_seed`` (a task row pinned to one phone,
        see ``TaskSource.gym_seeds``), else the gym's seed."""
        seed = (options or {}).get("seed", (task.model_extra or {}).get("gym_seed", self.seed))
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"the execution seed must be an integer, got {seed!r}")
        return seed

    def _register(
        self, task: Task, state: PhoneState, start_distance: int | None, seed: int
    ) -> SimExecution:
        execution_id = f"sim-{seed}-{next(self._ids)}"
        execution = SimExecution(
            self, execution_id, task, state, self.user_reply, start_distance, seed
        )
        self._live[execution_id] = execution
        return execution

    async def start(self, task: Task, options: dict[str, Any] | None = None) -> SimExecution:
        seed = self._seed(options, task)
        return self._register(*await self.offload(self._prepare, task, seed), seed)

    async def aclose(self) -> None:
        for execution in list(self._live.values()):
            await execution.close()
