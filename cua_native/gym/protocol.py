"""The async environment protocol (``docs/gym_protocol.md``).

A ``Gym`` hands out tasks and starts ``Execution``s; an ``Execution`` is one live environment
that is observed, acted on with canonical actions, evaluated and closed. Every implementation
(embedded simulator, HTTP client, ADB device) puts a timeout on every call and makes ``close``
idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from PIL.Image import Image as PILImage
from pydantic import BaseModel, ConfigDict, Field

from cua_native.actions.models import Action, Answer, Terminate

FAIL_ANSWER = "FAIL"
"""The answer ``evaluate`` receives when the agent's final action is ``terminate(failure)``:
OSWorld's ``FAIL``, the agent declaring the task infeasible (``final_answer``)."""


def final_answer(action: Action) -> str | None:
    """What ``evaluate`` is given for the episode's final action: an ``answer``'s text,
    ``FAIL_ANSWER`` for ``terminate(failure)``, else ``None``. Gyms that judge only state ignore
    it; OSWorld's ``infeasible`` tasks are judged by it alone (``docs/desktop.md``)."""
    if isinstance(action, Answer):
        return action.text
    if isinstance(action, Terminate) and action.status == "failure":
        return FAIL_ANSWER
    return None


class Task(BaseModel):
    """A gym task. Unknown fields are kept and passed through."""

    model_config = ConfigDict(extra="allow")

    task_id: str
    name: str = ""
    instruction: str = ""
    description: str = ""
    tags: list[str] = Field(default_factory=list)
    max_steps: int | None = None
    app: str | None = None
    difficulty: str | None = None
    category: str | None = None
    validation: Any = None

    @property
    def prompt_text(self) -> str:
        """What the agent is told: the instruction, falling back to the description."""
        return self.instruction or self.description or self.name


@dataclass(frozen=True, slots=True)
class Screenshot:
    """A screenshot as the environment gave it: encoded PNG/JPEG bytes, an (allow-listed) URL,
    or an in-memory PIL image (the embedded simulator, so nothing is encoded twice)."""

    png: bytes | None = None
    url: str | None = None
    image: PILImage | None = None
    accessibility_tree: str | None = None
    """The same screen as its accessibility tree (OSWorld's ``/accessibility`` XML), when the
    gym was asked for it (a desktop gym's ``accessibility_tree`` option); not an image."""

    def __post_init__(self) -> None:
        given = sum(v is not None for v in (self.png, self.url, self.image))
        if given != 1:
            raise ValueError("a Screenshot has exactly one of png bytes, url or image")


@dataclass(frozen=True, slots=True)
class Observation:
    screenshot: Screenshot
    width: int
    height: int
    turn: int = 0


@dataclass(frozen=True, slots=True)
class StepResult:
    """The outcome of ``Execution.act``. ``ok=False`` means the action was refused, not a crash."""

    ok: bool
    error: str | None = None
    observation: Observation | None = None
    feedback: str | None = None
    """Text for the model's next turn (a reply to ``ask_user``, an MCP tool result)."""


@dataclass(frozen=True, slots=True)
class ValidatorResult:
    id: str
    passed: bool
    score: float
    weight: float = 1.0
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        """The genv wire form (``pass`` rather than ``passed``)."""
        return {
            "id": self.id,
            "pass": self.passed,
            "score": self.score,
            "weight": self.weight,
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class Evaluation:
    reward: float
    success: bool
    validators: tuple[ValidatorResult, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict)


class GymError(Exception):
    """An environment failed (unreachable, crashed, timed out): infrastructure, not the agent."""


class ExecutionGone(GymError):
    """The execution no longer exists on the gym side."""


class ForkUnsupported(GymError):
    """The execution's backend cannot copy its state (``fork``): a capability it lacks, never
    a transient failure, so a caller must not fall back silently (``docs/gym_protocol.md``)."""


@runtime_checkable
class Execution(Protocol):
    @property
    def execution_id(self) -> str:
        """The execution's id on its gym (read-only: a wrapper may forward it)."""
        ...

    @property
    def task(self) -> Task:
        """The task this execution runs (read-only)."""
        ...

    async def observe(self) -> Observation: ...

    async def act(self, action: Action) -> StepResult: ...

    async def evaluate(self, answer: str | None = None) -> Evaluation: ...

    async def close(self) -> None:
        """Release the environment. Idempotent; never raises for an already-closed execution."""
        ...


@runtime_checkable
class ForkableExecution(Execution, Protocol):
    """An ``Execution`` that can copy itself: ``fork`` returns a new, independent execution of
    the same task in exactly the same state (screen, app data, turn counter), which continues
    as the original would on the same actions. The copy is the caller's to close. Optional:
    ``fork_execution`` is the one way to call it."""

    async def fork(self) -> Execution: ...


async def fork_execution(execution: Execution) -> Execution:
    """``execution.fork()``, or ``ForkUnsupported`` naming the backend that cannot fork (an
    HTTP execution raises it too when its server answers that the execution cannot)."""
    if not isinstance(execution, ForkableExecution):
        raise ForkUnsupported(
            f"{type(execution).__name__} cannot fork its state (execution "
            f"{execution.execution_id}); branching needs a forkable gym (the simulator, or a "
            "gym server whose capabilities list 'fork'); use anchor-state groups instead"
        )
    return await execution.fork()


@runtime_checkable
class ReplayableGym(Protocol):
    """A ``Gym`` whose executions are deterministic: a fresh execution of a task (same task,
    same options), given the same actions in the same order, shows exactly the same
    observations. That is what lets a lost execution be restored by replaying its actions
    (``gym/recovery.py``). Optional, and explicit: a gym without the method, or whose method
    answers ``False``, is never replayed (``gym_replays_exactly``)."""

    async def replays_exactly(self) -> bool: ...


async def gym_replays_exactly(gym: object) -> bool:
    """Whether ``gym`` declares exact replay (``ReplayableGym``); ``False`` for any gym that
    does not say so."""
    if not isinstance(gym, ReplayableGym):
        return False
    return await gym.replays_exactly() is True


@runtime_checkable
class Gym(Protocol):
    @property
    def gym_id(self) -> str:
        """The gym's id on its server (read-only: a wrapper may forward it)."""
        ...

    async def list_tasks(self) -> list[Task]: ...

    async def get_task(self, task_id: str) -> Task: ...

    async def start(self, task: Task, options: dict[str, Any] | None = None) -> Execution: ...

    async def aclose(self) -> None:
        """Release shared resources (connection pools). Idempotent."""
        ...


def reward_from_result(result: dict[str, Any] | None, success: bool | None) -> float:
    """The reward rule of the gym spec: ``score`` when present (a real 0 stays 0), else the
    weight-normalised validator scores, else ``success`` as 1.0/0.0."""
    result = result or {}
    score = result.get("score")
    if isinstance(score, int | float) and not isinstance(score, bool):
        return float(score)
    validators = result.get("validators") or []
    weighted = [
        (float(v.get("score", 1.0 if v.get("pass") else 0.0)), float(v.get("weight", 1.0)))
        for v in validators
        if isinstance(v, dict)
    ]
    total = sum(w for _, w in weighted)
    if weighted and total > 0:
        return sum(s * w for s, w in weighted) / total
    if success is None:
        success = bool(result.get("success", False))
    return 1.0 if success else 0.0
