"""Configuration of the agent loop (``AgentConfig``): serializable, so AReaL can ship it to
rollout workers as plain ``workflow_kwargs``."""

from __future__ import annotations

from typing import Any, Literal

from areal.api.cli_args import GenerationHyperparameters
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Family = Literal["mai_ui", "qwen3_vl"]


SAMPLING_FIELDS = ("max_new_tokens", "temperature", "top_p", "top_k", "greedy")
"""The ``SamplingConfig`` fields that ``GenerationHyperparameters`` carries under the same name."""


class SamplingConfig(BaseModel):
    """Per-turn generation settings (turned into AReaL's ``GenerationHyperparameters``)."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(512, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = -1
    greedy: bool = False

    def to_gconfig(self, stop_token_ids: list[int]) -> GenerationHyperparameters:
        return GenerationHyperparameters(
            n_samples=1,
            stop_token_ids=list(stop_token_ids),
            **{name: getattr(self, name) for name in SAMPLING_FIELDS},
        )


class AdbConfig(BaseModel):
    """How ``kind: adb`` reaches the devices the gym server hands out (``gym.adb.AdbGym``)."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    """The ADB server (``adb start-server``) that sees the devices."""
    port: int = Field(5037, ge=1, le=65535)
    app_packages: dict[str, str] = Field(default_factory=dict)
    """App name → Android package, for ``open_app``."""
    keyboard: bool = False
    """Type through the ADB keyboard IME (non-ASCII text) instead of ``input text``."""


class GymConfig(BaseModel):
    """Which environment to run on: the embedded simulator (``sim``), a gym server over HTTP
    (``http``), or a gym server whose executions are Android devices driven over ADB (``adb``:
    the server creates, evaluates and closes executions; observe and act go to the device), or
    real desktops through OSWorld's desktop-server API (``desktop``: ``gym.desktop.DesktopGym``,
    local Xvfb desktops unless ``options.remote_urls`` names servers)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["sim", "http", "adb", "desktop"] = "sim"
    base_url: str | None = None
    """The gym server (``http`` and ``adb``)."""
    gym_id: str = "sim"
    seed: int = 0
    allowed_media_domains: list[str] = Field(default_factory=list)
    """Hosts screenshot URLs may come from (presigned object-store links); the one allow-list
    of a run: the gym client, the prompt builder's HTTP client and vLLM all get it."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments for the gym client constructor (timeouts, allow-lists); checked
    against the kind's client at load. ``null`` means none (drops options a lower config layer
    set for another kind)."""
    adb: AdbConfig = Field(default_factory=AdbConfig)
    """ADB settings (``kind: adb`` only)."""

    @model_validator(mode="after")
    def _server_kinds_need_a_url(self) -> GymConfig:
        if self.kind in ("http", "adb") and not self.base_url:
            raise ValueError(f"kind '{self.kind}' needs base_url (the gym server's address)")
        return self

    @field_validator("options", mode="before")
    @classmethod
    def _null_is_no_options(cls, value: Any) -> Any:
        return {} if value is None else value

    @model_validator(mode="after")
    def _options_fit_the_kind(self) -> GymConfig:
        """``options`` are keyword arguments of the kind's client: a simulator option given to
        an HTTP gym is an error here, at load, not a ``TypeError`` after the model loaded."""
        accepted = gym_client_options(self.kind)
        unknown = sorted(set(self.options) - accepted)
        if unknown:
            raise ValueError(
                f"options {unknown} are not options of a '{self.kind}' gym; "
                f"it takes: {', '.join(sorted(accepted))}"
            )
        return self


def gym_client_options(kind: str) -> set[str]:
    """Keyword arguments ``make_gym`` may pass through ``GymConfig.options`` for ``kind``."""
    import inspect

    if kind == "sim":
        from cua_native.gym.sim import SimGym

        client: type[Any] = SimGym
        fixed = {"self", "seed"}
    elif kind == "desktop":
        from cua_native.gym.desktop.gym import DesktopGym

        client, fixed = DesktopGym, {"self", "tasks", "gym_id"}
    else:
        from cua_native.gym.http import HttpGym

        client, fixed = HttpGym, {"self", "base_url", "gym_id"}
    return set(inspect.signature(client.__init__).parameters) - fixed


class BranchConfig(BaseModel):
    """Branching rollouts (``rollout/branching.py``): at chosen turns an episode's execution is
    forked and ``children`` siblings (the episode's own continuation among them) each sample
    their own action from exactly the same screen; a turn's advantage is then computed against
    its same-state siblings (``rollout/credit.py``). Needs a forkable gym."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    children: int = Field(2, ge=2)
    """Siblings per branch point, the episode's own continuation included."""
    trigger: Literal["uncertainty", "schedule"] = "uncertainty"
    """``uncertainty``: branch at a turn whose action's first tokens the policy was unsure of
    (their surprisal ≥ ``threshold``); ``schedule``: at the turns listed in ``turns``."""
    turns: list[int] = Field(default_factory=lambda: [1])
    """``schedule``: turn indices (0 = first) at which root episodes branch."""
    threshold: float = Field(1.0, ge=0.0)
    """``uncertainty``: -log p (nats) of the action's first ``action_tokens`` sampled tokens
    (a one-sample estimate of their entropy; ``rollout/branching.py``)."""
    action_tokens: int = Field(8, ge=1)
    max_points: int = Field(2, ge=0)
    """Branch points per group: the budget. Extra environment steps are at most
    ``max_points * (children - 1) * max_turns``; the step table reports what was spent."""


class AnchorConfig(BaseModel):
    """Anchor-state groups (GiGPO) for gyms that cannot fork: turns of a group's episodes
    whose observation is identical (a hash of the screenshot and the task) form step-level
    groups; a turn's advantage gains ``weight`` × its step-level advantage."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    weight: float = Field(1.0, gt=0.0)


class ReplayConfig(BaseModel):
    """Success replay (``rollout/replay.py``): a bounded per-task buffer of successful episodes
    (their ids, log-probs and versions as generated); a group without a success gets the
    freshest one as an extra member, trained off-policy (the decoupled loss on the cluster
    path) while its oldest token is at most ``max_staleness`` versions behind the engine."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    per_task: int = Field(2, ge=1)
    max_staleness: int = Field(4, ge=0)


class CreditConfig(BaseModel):
    """Per-step credit beyond the episode's group advantage (``docs/contracts.md#per-step-credit``):
    each switch off by default."""

    model_config = ConfigDict(extra="forbid")

    branch: BranchConfig = Field(default_factory=BranchConfig)
    anchor: AnchorConfig = Field(default_factory=AnchorConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    dynamic_sampling: bool = False
    """Drop groups whose advantages are all 0 and sample others in their place (DAPO): the
    workflow returns ``None`` for them (AReaL's executor draws more tasks); the embedded
    trainer runs further tasks, at most ``dynamic_rounds`` rounds per step."""
    dynamic_rounds: int = Field(2, ge=1)

    @property
    def any(self) -> bool:
        return (
            self.branch.enabled
            or self.anchor.enabled
            or self.replay.enabled
            or self.dynamic_sampling
        )


class RecoveryConfig(BaseModel):
    """Recovery at the call: a fault costs a retry, not the episode
    (``docs/contracts.md#recovery-at-the-call``). The gym client's own retries (reads,
    idempotent actions, 429 after ``Retry-After``) are its ``retries`` option; these are the
    episode's."""

    model_config = ConfigDict(extra="forbid")

    replay: bool = True
    """Restore a lost execution by replaying its actions on a fresh one, checked against the
    last screen seen (``gym/recovery.py``); only on gyms that declare exact replay (the
    simulator, a gym server whose capabilities say ``replays_exactly``). Elsewhere, and when
    the check fails, the episode is rejected."""
    max_replays: int = Field(3, ge=0)
    """Restores (fresh executions) one episode may spend."""
    engine_retries: int = Field(2, ge=0)
    """Model calls that failed before answering (a connection reset, an inference server
    restart) sent again, per call; a timeout is never retried."""
    engine_backoff_s: float = Field(1.0, ge=0.0)
    """Seconds before each such retry (counted as time lost waiting)."""


class AgentConfig(BaseModel):
    """Everything the episode loop and the workflow need, apart from the model weights.

    Reward of an episode: ``R = evaluation.reward - format_penalty * parse_errors``. Turn ``t`` of
    ``T`` gets ``turn_discount ** (T - 1 - t) * A`` where ``A`` is ``R`` or, with
    ``group_reward_norm`` (the default), ``(R - mean) / (std + eps)`` over the group's episodes
    (``"mean"``: ``R - mean``).
    """

    model_config = ConfigDict(extra="forbid")

    family: Family = "mai_ui"
    model_path: str | None = None
    """The model (tokenizer + processor) directory; ``None`` means the embedded tiny model."""
    prompt: dict[str, Any] = Field(default_factory=dict)
    """Overrides for ``default_prompt_config(family, **prompt)``."""
    dialect: dict[str, Any] = Field(default_factory=dict)
    """Options for ``get_dialect(family, **dialect)``."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    gym: GymConfig = Field(default_factory=GymConfig)

    encode_images: bool = True
    """Encode screenshots as PNG/base64 for the request (remote SGLang/vLLM engines need them);
    the in-process engine reads the pixel tensors directly, so the embedded default turns it off."""

    max_turns: int = Field(15, ge=1)
    turn_timeout_s: float = Field(120.0, gt=0.0)
    """Limit on every single phase call of a turn (gym call, prompt build, generation)."""
    episode_timeout_s: float = Field(600.0, gt=0.0)
    """Time budget of one episode; running out ends it like ``max_turns`` (an agent failure)."""
    close_timeout_s: float = Field(30.0, gt=0.0)
    max_consecutive_parse_errors: int = Field(3, ge=1)

    format_penalty: float = Field(0.05, ge=0.0)
    """Subtracted from the episode reward once per unparseable turn."""
    turn_discount: float = Field(0.9, gt=0.0, le=1.0)
    group_size: int = Field(4, ge=1)
    group_reward_norm: bool | Literal["mean"] = True
    """Normalise rewards per episode inside the workflow (set AReaL's ``actor.reward_norm`` off):
    ``True`` ``(R - mean) / (std + eps)`` (GRPO), ``"mean"`` ``R - mean`` only (a reward
    difference keeps its size: a format penalty stays small next to a success), ``False`` raw."""
    reward_norm_eps: float = Field(1e-6, gt=0.0)
    infra_retries: int = Field(1, ge=0)
    """Fresh-execution retries of an episode that failed for infrastructure reasons."""
    recovery: RecoveryConfig = Field(default_factory=RecoveryConfig)
    """Recovery at the call (restore a lost execution, retry a failed model call) before an
    episode is rejected."""
    credit: CreditConfig = Field(default_factory=CreditConfig)
    """Branching rollouts, anchor-state groups, success replay, dynamic sampling (training
    only: evaluations run without them)."""

    @model_validator(mode="after")
    def _branching_needs_a_forkable_gym(self) -> AgentConfig:
        if self.credit.branch.enabled and self.gym.kind in ("adb", "desktop"):
            raise ValueError(
                f"credit.branch needs a gym that can fork executions; a '{self.gym.kind}' gym "
                "cannot (use credit.anchor: anchor-state groups need no fork)"
            )
        return self
