"""Seeded fault injection for the gym server: latency, 5xx answers, dropped connections, a
hanging create (the orphan scenario), and the chaos bench's environment faults: 429 with
``Retry-After`` (throttling), stalls (a request that hangs before it runs), crashes (the
execution dies: closed on the server, the request answered 502, later requests 404) and
answers lost after the handler ran (``drop_after``: the action acted, the client never hears).

Every decision comes from per-route ``random.Random`` streams seeded with ``(seed, route)``, so the
n-th request to a route always gets the same fate, whatever the interleaving of other routes (the
chaos faults draw from a stream of their own: adding them left the older fates unchanged).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

Route = Literal[
    "list_tasks", "get_task", "create", "observation", "actions", "evaluate", "terminate"
]
ROUTES: tuple[Route, ...] = (
    "list_tasks",
    "get_task",
    "create",
    "observation",
    "actions",
    "evaluate",
    "terminate",
)


class FaultProfileError(ValueError):
    """A fault profile that cannot be read or is invalid; the message is one line."""


Share = Annotated[float, Field(ge=0.0, le=1.0)]
"""A share of requests, in [0, 1]."""


class Latency(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    fixed_s: float = Field(0.0, ge=0.0)
    jitter_s: float = Field(0.0, ge=0.0)
    """Uniform extra delay in ``[0, jitter_s]``."""


class CreateHang(BaseModel):
    """Sleep ``seconds`` before creating (then create anyway) on a share of creates."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    seconds: float = Field(0.0, ge=0.0)
    share: float = Field(1.0, ge=0.0, le=1.0)
    first_n: int | None = Field(None, ge=0)
    """Only the first n creates may hang (``None``: every create is eligible)."""


class FaultProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    seed: int = 0
    latency: Latency = Field(default_factory=Latency)
    latency_routes: list[Route] | None = None
    """Routes that get the latency (``None``: all)."""
    error_share: dict[Route | Literal["*"], Share] = Field(default_factory=dict)
    """Share of requests answered with ``error_status`` before the handler runs; ``*`` = default."""
    error_status: int = Field(503, ge=500, le=599)
    drop_share: dict[Route | Literal["*"], Share] = Field(default_factory=dict)
    """Share of requests whose connection is closed without an answer before the handler runs."""
    create_hang: CreateHang = Field(default_factory=CreateHang)
    throttle_share: dict[Route | Literal["*"], Share] = Field(default_factory=dict)
    """Share of requests answered 429 with ``Retry-After: retry_after_s`` before the handler
    runs."""
    retry_after_s: int = Field(1, ge=0)
    stall_share: dict[Route | Literal["*"], Share] = Field(default_factory=dict)
    """Share of requests that hang ``stall_s`` before the handler runs (past a client's timeout,
    the client sees no answer; the handler still runs after the stall)."""
    stall_s: float = Field(0.0, ge=0.0)
    drop_after_share: dict[Route | Literal["*"], Share] = Field(default_factory=dict)
    """Share of requests whose handler runs (an action acts, a create creates) and whose
    answer is then lost: the connection closes mid-answer."""
    crash_share: dict[Route | Literal["*"], Share] = Field(default_factory=dict)
    """Share of requests to an execution (observation, actions, evaluate) whose execution
    crashes: the server closes it and answers 502; later requests to it get 404."""

    @classmethod
    def load(cls, source: str | Path) -> FaultProfile:
        """From a JSON/YAML file path, or from inline JSON text; ``FaultProfileError`` (one
        line naming what is wrong) for anything else."""
        text = str(source).strip()
        if text.startswith("{"):
            origin, raw, as_json = "inline JSON", text, True
        else:
            path = Path(source)
            if not path.is_file():
                raise FaultProfileError(
                    f"{text!r} is neither inline JSON ({{...}}) nor a file (JSON or YAML)"
                )
            try:
                raw = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                raise FaultProfileError(f"cannot read {str(path)!r}: {error}") from None
            origin, as_json = str(path), path.suffix == ".json"
        try:
            data = json.loads(raw) if as_json else yaml.safe_load(raw)
        except (ValueError, yaml.YAMLError) as error:
            what = "JSON" if as_json else "YAML"
            reason = " ".join(str(error).split())
            raise FaultProfileError(f"{origin} is not valid {what}: {reason}") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise FaultProfileError(
                f"{origin}: expected a mapping of fields, got {type(data).__name__}"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise FaultProfileError(f"{origin}: {_problems(error)}") from None

    def share_of(self, table: dict[Route | Literal["*"], float], route: Route) -> float:
        return table.get(route, table.get("*", 0.0))


def _problems(error: ValidationError) -> str:
    """Each problem as ``field: what (got value)``; a key of a route table that names no route
    is one problem, however many alternatives it failed."""
    problems: list[str] = []
    for item in error.errors():
        loc = [str(part) for part in item["loc"]]
        if "[key]" in loc:
            where = ".".join(loc[: loc.index("[key]") - 1])  # (table, key, "[key]", ...)
            what = f"{where}: unknown route {_shown(item.get('input'))} (routes: "
            what += f"{', '.join(ROUTES)}, or '*' for the rest)"
        else:
            what = f"{'.'.join(loc) or 'profile'}: {item['msg']} (got {_shown(item.get('input'))})"
        if what not in problems:
            problems.append(what)
    return "; ".join(problems)


def _shown(value: object, limit: int = 60) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class FaultDecision:
    delay_s: float = 0.0
    error: bool = False
    drop: bool = False
    throttle: bool = False
    stall_s: float = 0.0
    crash: bool = False
    drop_after: bool = False

    @property
    def kind(self) -> str | None:
        """The fault that decides the answer (``None``: the request runs, perhaps late)."""
        for kind, hit in (
            ("crash", self.crash),
            ("drop", self.drop),
            ("error", self.error),
            ("throttle", self.throttle),
            ("drop_after", self.drop_after),
        ):
            if hit:
                return kind
        return "stall" if self.stall_s > 0 else None


EXECUTION_ROUTES: frozenset[Route] = frozenset({"observation", "actions", "evaluate"})
"""Routes of a live execution: the ones a crash can hit."""


class FaultInjector:
    """Turns a profile into per-request decisions (one RNG stream per route)."""

    def __init__(self, profile: FaultProfile) -> None:
        self.profile = profile
        self._rngs = {route: random.Random(f"{profile.seed}:{route}") for route in ROUTES}
        self._chaos = {route: random.Random(f"{profile.seed}:{route}:chaos") for route in ROUTES}
        self._after = {route: random.Random(f"{profile.seed}:{route}:after") for route in ROUTES}
        self._hang_rng = random.Random(f"{profile.seed}:create_hang")
        self._creates = 0

    def decide(self, route: Route) -> FaultDecision:
        p = self.profile
        rng = self._rngs[route]
        jitter, fail, drop = rng.random(), rng.random(), rng.random()
        delay = 0.0
        if p.latency_routes is None or route in p.latency_routes:
            delay = p.latency.fixed_s + jitter * p.latency.jitter_s
        chaos = self._chaos[route]
        throttle, stall, crash = chaos.random(), chaos.random(), chaos.random()
        return FaultDecision(
            delay_s=delay,
            drop=drop < p.share_of(p.drop_share, route),
            error=fail < p.share_of(p.error_share, route),
            throttle=throttle < p.share_of(p.throttle_share, route),
            stall_s=p.stall_s if stall < p.share_of(p.stall_share, route) else 0.0,
            crash=route in EXECUTION_ROUTES and crash < p.share_of(p.crash_share, route),
            drop_after=self._after[route].random() < p.share_of(p.drop_after_share, route),
        )

    def create_hang_s(self) -> float:
        """Seconds the next creation hangs (0: none)."""
        hang = self.profile.create_hang
        index = self._creates
        self._creates += 1
        draw = self._hang_rng.random()
        if hang.seconds <= 0 or (hang.first_n is not None and index >= hang.first_n):
            return 0.0
        return hang.seconds if draw < hang.share else 0.0
