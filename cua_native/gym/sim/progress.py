"""Progress along a task's solution path: the simulator's optional dense reward.

The *distance* of a phone state is the number of actions the task's known solution
(``solver.next_step``) still needs from it, its closing ``terminate`` included, found by
playing the solver on a copy of the state (the execution's own state is never touched). A
task's *progress* at the end of an episode is ``(d_start - d_end) / d_start``, clipped to
[0, 1]: the share of the solution path the agent covered. It telescopes: it equals the sum of
a per-action credit ``(d_before - d_after) / d_start``, so every action that advances along the
path earns ``1 / d_start`` and every detour (an app the task does not need) costs as much, in
whichever turn it happens. A state the solver cannot finish from within ``limit`` actions has
distance ``limit`` (no progress).

``SimGym(progress_reward=w)`` turns it into a reward: a successful episode is worth 1, a
failed one the larger of its validators' partial credit (the reward without this option) and
``w * progress`` (``w`` < 1, so any success beats any failure). Success itself is
untouched: it is still the task's validators, and the evaluation reports progress apart
(``Evaluation.raw["progress"]``).
"""

from __future__ import annotations

import copy

from cua_native.actions import models as m
from cua_native.actions.coords import PixelSpace
from cua_native.gym.protocol import Task
from cua_native.gym.sim.execute import Phone
from cua_native.gym.sim.screens import build_layout
from cua_native.gym.sim.solver import next_step
from cua_native.gym.sim.state import PhoneState

DEFAULT_LIMIT = 30
"""The longest solution path looked for (no catalogue task needs more than 30 actions)."""


def solution_distance(
    task: Task, state: PhoneState, space: PixelSpace, limit: int = DEFAULT_LIMIT
) -> int:
    """Actions the solution still needs from ``state`` (its closing ``terminate`` or ``answer``
    included), at most ``limit``. ``state`` is not modified. How the episode ended is ignored:
    an answer or a ``terminate`` the agent gave earns no credit of its own (a wrong answer or
    giving up is not the end of the path; a right one is credited by success)."""
    probe = copy.deepcopy(state)
    probe.answer = None
    probe.terminated = None
    phone = Phone(probe, space, user_reply="")
    for taken in range(limit):
        step = next_step(task, probe, build_layout(probe))
        if step is None:
            return taken
        action = step[0]
        if action.type in m.EPISODE_ENDING:
            return taken + 1
        if not phone.apply(action).ok:
            return limit
    return limit


def progress(start_distance: int, end_distance: int) -> float:
    """The share of the solution path covered, in [0, 1] (1 when nothing was left to do)."""
    if start_distance <= 0:
        return 1.0
    return min(1.0, max(0.0, (start_distance - end_distance) / start_distance))


def shaped_reward(success: bool, covered: float, weight: float, partial: float = 0.0) -> float:
    """1 for a success, else the larger of ``partial`` (the validators' credit) and
    ``weight * covered`` (``weight`` in [0, 1)): progress never lowers a failure's reward."""
    return 1.0 if success else max(partial, weight * covered)
