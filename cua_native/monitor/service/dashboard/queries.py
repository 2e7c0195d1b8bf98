"""Read queries behind the dashboard pages (sync; the app runs them off the event loop)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from cua_native.monitor.db.schema import (
    Action,
    Baseline,
    Environment,
    Eval,
    Obs,
    Rollout,
    Step,
    Task,
    Training,
    Turn,
    Validation,
)
from cua_native.monitor.db.store import TERMINAL_ROLLOUT
from cua_native.monitor.screenshots import SCREENSHOT_DIR
from cua_native.monitor.service.dashboard.overlay import Shape, shapes_for

DEFAULT_VIEWBOX = 1000
SOURCES: dict[str, tuple[type[Step] | type[Eval] | type[Baseline], Any]] = {
    "step": (Step, Rollout.step_id),
    "eval": (Eval, Rollout.eval_id),
    "baseline": (Baseline, Rollout.baseline_id),
}


def loads(text: str | None) -> Any:
    """Parse a JSON text column; a non-JSON text is returned as is."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def trainings(session: Session) -> list[dict[str, Any]]:
    rows = session.scalars(select(Training).order_by(Training.id.desc())).all()
    last_reward = dict(
        session.execute(
            select(Step.training_id, Step.reward_mean)
            .where(Step.reward_mean.is_not(None))
            .order_by(Step.step)
        ).all()
    )
    return [{"training": row, "last_reward": last_reward.get(row.id)} for row in rows]


def training(session: Session, training_id: int) -> dict[str, Any] | None:
    row = session.get(Training, training_id)
    if row is None:
        return None
    steps = session.scalars(
        select(Step).where(Step.training_id == training_id).order_by(Step.step)
    ).all()
    success: dict[int, float] = dict(
        session.execute(
            select(Rollout.step_id, func.avg(case((Rollout.task_success == 1, 1.0), else_=0.0)))
            .join(Step, Step.id == Rollout.step_id)
            .where(Step.training_id == training_id, Rollout.status.in_(TERMINAL_ROLLOUT))
            .group_by(Rollout.step_id)
        ).all()
    )
    evals = session.scalars(
        select(Eval).where(Eval.training_id == training_id).order_by(Eval.step)
    ).all()
    baselines = session.scalars(
        select(Baseline).where(Baseline.training_id == training_id).order_by(Baseline.id)
    ).all()
    credit = {s.id: line for s in steps if (line := credit_line(s.metrics_json)) is not None}
    return {
        "training": row,
        "steps": steps,
        "credit": credit,
        "success": {k: float(v) for k, v in success.items() if v is not None},
        "evals": evals,
        "baselines": baselines,
        "outcomes": eval_outcomes(session, [e.id for e in evals], [b.id for b in baselines]),
    }


def credit_line(metrics_json: str | None) -> str | None:
    """A step's per-step credit figures as one line (``branch_points 3 · extra_env_steps 9 …``):
    the embedded trainer's ``credit/…`` metrics, or the mean of AReaL's ``…cua/credit/…``
    stats on the cluster path; ``None`` when the step has none (every switch off)."""
    try:
        metrics = json.loads(metrics_json) if metrics_json else {}
    except ValueError:
        return None
    if not isinstance(metrics, dict):
        return None
    found: dict[str, float] = {}
    for key, value in metrics.items():
        name = key.split("credit/", 1)[1] if "credit/" in key else None
        if name is None or not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if name.endswith("/avg"):
            name = name.removesuffix("/avg") + " (mean)"
        elif "/" in name:
            continue
        found[name] = float(value)
    return " · ".join(f"{k} {v:g}" for k, v in sorted(found.items())) or None


def eval_outcomes(
    session: Session, eval_ids: list[int], baseline_ids: list[int]
) -> dict[tuple[str, int], dict[str, list[bool]]]:
    """``("eval" | "baseline", id)`` → task id → success of each finished rollout (what the
    per-task bootstrap intervals of the evaluation chart resample)."""
    rows = session.execute(
        select(Rollout.eval_id, Rollout.baseline_id, Task.task_id, Rollout.task_success)
        .join(Task, Task.id == Rollout.task_id)
        .where(
            Rollout.status.in_(TERMINAL_ROLLOUT),
            Rollout.eval_id.in_(eval_ids) | Rollout.baseline_id.in_(baseline_ids),
        )
    ).all()
    out: dict[tuple[str, int], dict[str, list[bool]]] = {}
    for eval_id, baseline_id, task_id, success in rows:
        if eval_id is not None:
            key = ("eval", eval_id)
        elif baseline_id is not None:
            key = ("baseline", baseline_id)
        else:  # the query asks for rows with one of the two
            continue
        out.setdefault(key, {}).setdefault(task_id, []).append(success == 1)
    return out


def source(session: Session, kind: str, source_id: int) -> dict[str, Any] | None:
    model, column = SOURCES[kind]
    row = session.get(model, source_id)
    if not isinstance(row, Step | Eval | Baseline):
        return None
    rollouts = session.execute(
        select(Rollout, Task.task_id, Task.name)
        .join(Task, Task.id == Rollout.task_id)
        .where(column == source_id)
        .order_by(Rollout.group, Rollout.env_index, Rollout.id)
    ).all()
    return {
        "kind": kind,
        "row": row,
        "training": session.get(Training, row.training_id),
        "rollouts": [
            {"rollout": r, "task_key": key, "task_name": name} for r, key, name in rollouts
        ],
    }


@dataclass(slots=True)
class TurnView:
    turn: Turn
    screenshot: str | None
    """A URL the page can load: ``/screenshots/<sha[:2]>/<file>`` or the gym's URL."""
    width: int
    height: int
    actions: list[dict[str, Any]] = field(default_factory=list)
    shapes: list[Shape] = field(default_factory=list)
    observations: list[Obs] = field(default_factory=list)


def _screenshot_url(uri: str | None) -> str | None:
    if not uri:
        return None
    if uri.startswith(("http://", "https://")):
        return uri
    if uri.startswith(f"{SCREENSHOT_DIR}/"):
        return f"/{uri}"
    return None


def _tokens(action: Action) -> list[dict[str, Any]]:
    tokens, logprobs = loads(action.tokens), loads(action.logprobs)
    if not isinstance(tokens, list):
        return []
    if not isinstance(logprobs, list):
        logprobs = []
    out: list[dict[str, Any]] = []
    for index, entry in enumerate(tokens):
        token = entry.get("text", entry.get("id")) if isinstance(entry, dict) else entry
        logprob = logprobs[index] if index < len(logprobs) else None
        if isinstance(logprob, int | float) and math.isfinite(logprob):
            probability = math.exp(min(0.0, logprob))
            out.append({"text": str(token), "logprob": logprob, "hue": round(120 * probability)})
        else:
            out.append({"text": str(token), "logprob": None, "hue": None})
    return out


def rollout(session: Session, rollout_id: int) -> dict[str, Any] | None:
    row = session.get(Rollout, rollout_id)
    if row is None:
        return None
    turns = session.scalars(
        select(Turn).where(Turn.rollout_id == rollout_id).order_by(Turn.turn)
    ).all()
    turn_ids = [t.id for t in turns]
    observations: dict[int, list[Obs]] = {}
    actions: dict[int, list[Action]] = {}
    if turn_ids:
        for obs in session.scalars(select(Obs).where(Obs.turn_id.in_(turn_ids)).order_by(Obs.id)):
            observations.setdefault(obs.turn_id, []).append(obs)
        for action in session.scalars(
            select(Action).where(Action.turn_id.in_(turn_ids)).order_by(Action.id)
        ):
            actions.setdefault(action.turn_id, []).append(action)
    views = []
    for turn in turns:
        shots = [o for o in observations.get(turn.id, []) if o.screenshot_uri]
        shot = next(
            (o for o in shots if o.obs_type in (None, "screenshot", "screenshot_before")), None
        )
        shot = shot or (shots[0] if shots else None)
        width = (shot.width if shot and shot.width else None) or DEFAULT_VIEWBOX
        height = (shot.height if shot and shot.height else None) or DEFAULT_VIEWBOX
        view = TurnView(
            turn=turn,
            screenshot=_screenshot_url(shot.screenshot_uri if shot else None),
            width=width,
            height=height,
            observations=observations.get(turn.id, []),
        )
        for action in actions.get(turn.id, []):
            args = loads(action.tool_args)
            view.shapes.extend(shapes_for(action.action_type, args, width, height))
            view.actions.append({"action": action, "args": args, "tokens": _tokens(action)})
        views.append(view)
    source_kind = row.source_type
    source_id = {"step": row.step_id, "eval": row.eval_id, "baseline": row.baseline_id}.get(
        source_kind
    )
    return {
        "rollout": row,
        "task": session.get(Task, row.task_id),
        "turns": views,
        "validations": session.scalars(
            select(Validation).where(Validation.rollout_id == rollout_id).order_by(Validation.id)
        ).all(),
        "environments": session.scalars(
            select(Environment).where(Environment.rollout_id == rollout_id)
        ).all(),
        "source_kind": source_kind,
        "source_id": source_id,
    }
