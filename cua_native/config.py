"""The training config: AReaL's ``GRPOConfig`` plus a ``cua`` section and CUA vLLM settings.

One YAML file drives both paths of ``python -m cua_native.train``:

- ``cua.mode: embedded`` — one process, CPU or one GPU: the in-process engine, AReaL's
  ``PPOActor`` on ``LocalTrainEngine``, the simulator or a gym server;
- ``cua.mode: areal`` — AReaL's ``PPOTrainer`` on its own schedulers and inference servers.

AReaL's fields keep their meaning (``actor.optimizer.lr``, ``actor.eps_clip``,
``total_train_steps``, ``train_dataset.batch_size`` = tasks per step, …). Everything
CUA-specific lives under ``cua`` and is validated by pydantic before anything starts, so a
wrong field gives one error naming the field and the allowed values.
"""

from __future__ import annotations

import copy
import difflib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from areal.api.cli_args import GRPOConfig, vLLMConfig
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cua_native.rollout.config import (
    SAMPLING_FIELDS,
    AgentConfig,
    CreditConfig,
    SamplingConfig,
    gym_client_options,
)
from cua_native.rollout.dataset import TaskSource


class ConfigError(ValueError):
    """A config file or override is wrong; the message names the field and what is allowed."""


@dataclass
class CUAvLLMConfig(vLLMConfig):
    """AReaL's vLLM server settings plus what CUA needs (passed through as CLI flags).

    Many screenshots per prompt and long histories need a 256k context and 64 images per
    prompt; screenshots given as URLs need their hosts allow-listed (vLLM refuses others).
    ``logprobs_mode``: vLLM's default, ``raw_logprobs``, reports ``log_softmax`` of the raw
    logits, without temperature; ``processed_logprobs`` (vLLM >= 0.10.0) reports the log-probs
    of the distribution tokens are sampled from, which PPO's importance weights need.
    """

    max_model_len: int | None = 262144
    limit_mm_per_prompt: str = '{"image": 64}'
    allowed_media_domains: list[str] = field(default_factory=list)
    logprobs_mode: str = "processed_logprobs"


@dataclass
class CUATrainConfig(GRPOConfig):
    experiment_name: str = "cua"
    trial_name: str = "default"
    vllm: CUAvLLMConfig = field(default_factory=CUAvLLMConfig)
    cua: dict[str, Any] = field(default_factory=dict)
    """The ``cua`` section, left untyped for OmegaConf: ``CUASettings`` is its one schema."""


class WarmStart(BaseModel):
    """Supervised warm start of the embedded model on the simulator's solution paths.

    A randomly initialised tiny model never produces a parseable action, so every episode
    gets the same reward and GRPO has no signal. A few hundred supervised steps on
    demonstrations (each sim task knows a solution path) make it a weak but non-trivial policy
    that RL then improves. Real checkpoints (``--model``) skip this.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    steps: int = Field(150, ge=0)
    lr: float = Field(2e-3, gt=0.0)
    batch_size: int = Field(4, ge=1)
    seed: int = 0
    goal_in_thought: bool = False
    """Demonstrated thoughts restate the instruction before the step ("Goal: Turn on Wi-Fi.
    Tap Wi-Fi."): the model learns to copy the goal, then to act on what it just wrote, so its
    first choice follows the instruction ("Open Notes" opens Notes). Outputs grow by the
    instruction's length: raise ``max_new_tokens`` to match
    (bench/experiments/results/goal-in-the-thought/README.md#goal-in-the-thought)."""
    early_stop_share: float = Field(0.0, ge=0.0, le=1.0)
    """Share of solution paths that also carry an imperfect demonstrator's turn: at one step
    drawn uniformly from the path's steps before its last (and after ``early_stop_after`` of
    its actions; a path with no such step stays clean), the demonstrator claims the task
    done (``terminate(success)``) where the path goes on. The warm-started policy then stops
    early there about as often as it goes on (the premature "done" of real agents), which the
    gym's evaluation scores as a failure and RL must unlearn. 0: clean paths only. Drawn per
    (seed, phone, task) from ``seed`` (bench/experiments/results/imperfect-demonstrator/README.md#imperfect-demonstrator)."""
    early_stop_after: int = Field(0, ge=0)
    """An early stop comes after at least this many of the path's actions. 0: any step before
    the last, the first screen included, where one-action paths ("Open Notes": open, then
    done) put all of theirs; 1: only after some progress, so that no demonstration stops on
    the screen every episode starts from (bench/experiments/results/early-stop-after-progress/README.md#early-stop-after-progress)."""
    gym_seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    """Simulator seeds the demonstrations are played under (each seed varies the phone's data,
    so the model sees the same task on several screens). The tasks are ``cua.tasks``'s."""


class CUASettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["embedded", "areal"] = "embedded"
    run_dir: Path = Path("runs/default")
    agent: AgentConfig = Field(default_factory=AgentConfig)
    tasks: TaskSource = Field(default_factory=lambda: TaskSource(split="train"))
    eval_tasks: TaskSource | None = None
    baseline: bool = True
    eval_every: int = Field(0, ge=0)
    """Evaluate every this many steps (0: never). The embedded trainer also evaluates after the
    last step; on the cluster path AReaL's ``evaluator.freq_steps`` is derived from it."""
    eval_episodes_per_task: int = Field(1, ge=1)
    """Episodes per eval task in the baseline and every evaluation (the eval group size)."""
    eval_temperature: float | None = Field(None, ge=0.0)
    """Sampling temperature of the baseline and every evaluation (default: the agent's,
    ``agent.sampling.temperature``); lets training sample hotter than it is measured."""
    skip_uniform_groups: bool = False
    """Embedded trainer: leave out of the update every uniform group (its episodes all earned
    the same reward, so its rows' rewards are all 0 after the group normalisation:
    ``rollout.trajectory.is_uniform_group``); the workflow decides it from the rewards and
    builds no rows for it. Such groups carry no policy gradient, only the update's cost (and,
    with ``actor.kl_ctl`` > 0, KL terms).
    DAPO's dynamic-sampling filter without the resampling: the step trains on fewer groups,
    and a step whose groups are all uniform makes no update (the weights' version stays)."""
    monitor_db: str | None = "sqlite"
    """``sqlite`` = ``<run_dir>/monitor.db``; a SQLAlchemy URL; or null for no store."""
    monitor_url: str | None = None
    monitor_token: str | None = None
    warm_start: WarmStart = Field(default_factory=WarmStart)
    device: str = "cpu"

    def eval_agent(self) -> AgentConfig:
        """The agent of the baseline and evaluations: ``eval_episodes_per_task`` per group,
        sampled at ``eval_temperature`` when that is set."""
        update: dict[str, Any] = {
            "group_size": self.eval_episodes_per_task,
            "credit": CreditConfig(),  # an evaluation measures the policy, nothing else
        }
        if self.eval_temperature is not None:
            update["sampling"] = self.agent.sampling.model_copy(
                update={"temperature": self.eval_temperature}
            )
        return self.agent.model_copy(update=update)

    def monitor_db_url(self) -> str | None:
        if self.monitor_db is None:
            return None
        if self.monitor_db == "sqlite":
            return f"sqlite:///{(self.run_dir / 'monitor.db').resolve()}"
        return self.monitor_db


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config: AReaL's dataclass (its ``cua`` left as a dict) and our section."""

    areal: CUATrainConfig
    cua: CUASettings


@dataclass(frozen=True)
class _Layer:
    """One user-written layer of the config and where it came from (for error messages)."""

    origin: str
    values: Any

    def sets(self, key: str) -> bool:
        missing = object()
        return OmegaConf.select(self.values, key, default=missing) is not missing


def _origin(layers: list[_Layer], key: str) -> str:
    """`` (set in <file>)`` for the last layer that sets ``key`` (or a parent of it)."""
    parts = key.split(".")
    for depth in range(len(parts), 0, -1):
        prefix = ".".join(parts[:depth])
        for layer in reversed(layers):
            if layer.sets(prefix):
                return f" (set in {layer.origin})"
    return ""


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (nested) pydantic model that ``loc`` points into."""
    current: Any = model
    for part in loc:
        field_info = getattr(current, "model_fields", {}).get(part)
        if field_info is None:
            return []
        annotation = field_info.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        current = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if current is None:
            return []
    return sorted(current.model_fields)


def _unknown(leaf: str, allowed: list[str]) -> str:
    """``unknown field 'x'. Did you mean 'y'? Allowed: ...``"""
    close = difflib.get_close_matches(leaf, allowed, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return f"unknown field '{leaf}'.{hint} Allowed: {', '.join(allowed)}"


MOVED = {"cua.checkpoint_every": "saver.freq_steps (AReaL's own field, read on both paths)"}
"""Fields that left the ``cua`` section, and where they went."""


def _describe(error: ValidationError, layers: list[_Layer]) -> str:
    """Each pydantic error of the ``cua`` section as ``cua.a.b: what (set in FILE)``."""
    lines = []
    for item in error.errors():
        where = ".".join(str(p) for p in ("cua", *item["loc"]))
        if item["type"] == "extra_forbidden":
            allowed = _fields_at(CUASettings, tuple(item["loc"][:-1]))
            what = _unknown(str(item["loc"][-1]), allowed)
            moved = MOVED.get(where)
            if moved:
                what = f"{what}. It moved to {moved}"
        else:
            got = item.get("input")
            shown = "" if isinstance(got, dict) else f" (got {json.dumps(got, default=str)})"
            what = f"{item['msg']}{shown}"
        lines.append(f"{where}: {what}{_origin(layers, where)}")
    return "; ".join(lines)


def _describe_omegaconf(error: OmegaConfBaseException, schema: Any, layers: list[_Layer]) -> str:
    """One line: the field, what is wrong, what is allowed there and which file set it."""
    key = str(getattr(error, "full_key", "") or "")
    message = str(getattr(error, "msg", error)).splitlines()[0]
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(schema, parent_key) if parent_key else schema
    if "not in" in message and parent is not None and OmegaConf.is_config(parent):
        message = _unknown(leaf, sorted(str(k) for k in parent.keys()))
    return f"config error: {key or 'top level'}: {message}{_origin(layers, key)}"


DERIVED: dict[str, str] = {
    "actor.temperature": "cua.agent.sampling.temperature",
    **{
        f"{g}.{name}": f"cua.agent.sampling.{name}"
        for g in ("gconfig", "eval_gconfig")
        for name in SAMPLING_FIELDS
    },
    "eval_gconfig.temperature": "cua.agent.sampling.temperature (or cua.eval_temperature)",
    "evaluator.freq_steps": "cua.eval_every",
}
"""AReaL fields the loader sets from the ``cua`` section (value: the field they come from).

The workflow samples with ``cua.agent.sampling``; PPO's ratio compares the trainer's log-probs
with the engine's, taken under the sampling temperature, so the trainer's temperature is that
one (1 for ``temperature: 0``, as the engine reports greedy log-probs). AReaL's ``gconfig``
mirrors the same settings so its logs show what ran. ``cua.eval_every`` is the one evaluation
frequency: the embedded trainer reads it, AReaL's evaluator on the cluster path reads
``evaluator.freq_steps``."""


def _reject_derived(layers: list[_Layer]) -> None:
    """A derived field written by hand is an error naming the field to set instead."""
    for key, source in DERIVED.items():
        for layer in layers:
            if layer.sets(key):
                raise ConfigError(
                    f"config error: {key} is derived from {source}; set that instead "
                    f"(set in {layer.origin})"
                )


def derive_sampling(
    areal: CUATrainConfig, sampling: SamplingConfig, eval_sampling: SamplingConfig
) -> None:
    """Write ``cua.agent.sampling`` into the AReaL fields of ``DERIVED``; ``eval_gconfig``
    gets ``eval_sampling``, the evaluations' own (``CUASettings.eval_agent``)."""
    areal.actor.temperature = sampling.temperature if sampling.temperature > 0 else 1.0
    for gconfig, source in ((areal.gconfig, sampling), (areal.eval_gconfig, eval_sampling)):
        if gconfig is not None:
            for name in SAMPLING_FIELDS:
                setattr(gconfig, name, getattr(source, name))


def derive_eval_frequency(areal: CUATrainConfig, cua: CUASettings) -> None:
    """``evaluator.freq_steps`` from ``cua.eval_every`` (0, or no ``cua.eval_tasks``: never)."""
    evaluates = cua.eval_every > 0 and cua.eval_tasks is not None
    areal.evaluator.freq_steps = cua.eval_every if evaluates else None


def check_consistency(areal: CUATrainConfig, cua: CUASettings) -> None:
    """Cross-field rules between AReaL's section and ours."""
    if areal.gconfig.n_samples != 1:
        raise ConfigError(
            "config error: gconfig.n_samples must be 1 (got "
            f"{areal.gconfig.n_samples}); the CUA workflow runs cua.agent.group_size episodes "
            "per task itself so that a failed episode rejects its whole group"
        )
    if cua.agent.group_reward_norm and areal.actor.reward_norm is not None:
        raise ConfigError(
            "config error: actor.reward_norm must be null when cua.agent.group_reward_norm is "
            "true (rewards are normalised per episode inside the workflow; AReaL's per-sample "
            "group norm would mix turns of different episodes)"
        )
    if cua.mode == "areal" and cua.agent.gym.kind == "sim":
        raise ConfigError(
            "config error: cua.agent.gym.kind 'sim' runs in-process only; cua.mode 'areal' "
            "needs a gym server (cua.agent.gym.kind: http with base_url), e.g. "
            "`python -m cua_native.gym.server` serves the simulator"
        )


BASE_LAYER: dict[str, Any] = {
    "train_dataset": {"path": "gym-tasks", "type": "rl", "batch_size": 2},
    "actor": {
        "experiment_name": "${experiment_name}",
        "trial_name": "${trial_name}",
        "backend": "fsdp:d1",
        "reward_norm": None,
        "adv_norm": None,
        "kl_ctl": 0.0,
        "ppo_n_minibatches": 1,
        "recompute_logprob": True,
        "use_decoupled_loss": False,
    },
    "rollout": {
        "backend": "sglang:d1",
        "max_concurrent_rollouts": 8,
        # groups per step, and the names under which running servers and disk weight updates are
        # found (docs/contracts.md#cluster-batch-size, #cluster-experiment-names)
        "consumer_batch_size": "${train_dataset.batch_size}",
        "experiment_name": "${experiment_name}",
        "trial_name": "${trial_name}",
    },
    "gconfig": {"n_samples": 1},
    **{
        part: {
            "experiment_name": "${experiment_name}",
            "trial_name": "${trial_name}",
            "fileroot": "${cua.run_dir}/areal",
        }
        for part in ("saver", "evaluator", "recover", "stats_logger")
    },
    # What the interpolations above need; every other default is CUASettings'.
    "cua": {"run_dir": str(CUASettings.model_fields["run_dir"].default)},
}
"""AReaL fields every CUA run shares; a config file or override replaces any of them."""


def default_config_path() -> Path:
    """``configs/default.yaml``: in a checkout it sits next to the package; a built wheel
    carries it inside the package (``pyproject.toml`` force-includes it)."""
    beside = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"
    if beside.is_file():
        return beside
    return Path(str(resources.files("cua_native").joinpath("configs/default.yaml")))


def _user_layers(path: Path, overrides: list[str] | None) -> list[_Layer]:
    """The config file and the command-line overrides, in merge order."""
    if not path.is_file():
        raise ConfigError(f"config error: no config file at {path} (no such file)")
    try:
        values = OmegaConf.load(path)
    except Exception as e:  # yaml errors carry line numbers; keep them
        raise ConfigError(
            f"config error: {path} is not valid YAML: {e}".replace("\n", " ")
        ) from None
    if not isinstance(values, DictConfig):
        raise ConfigError(
            f"config error: {path}: the top level must be a mapping of fields (key: value), "
            f"got a {'list' if isinstance(values, ListConfig) else type(values).__name__}"
        )
    if not values:
        raise ConfigError(
            f"config error: {path} is empty; a config sets its fields (see "
            f"{default_config_path()}), or leave --config out for the embedded default"
        )
    layers = [_Layer(str(path), values)]
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"config error: override {item!r} is not of the form key=value")
    if overrides:
        layers.append(_Layer("the command line", OmegaConf.from_dotlist(overrides)))
    return layers


def _with_gym_url(layers: list[_Layer], url: str) -> list[_Layer]:
    """``layers`` with the gym turned into an HTTP gym at ``url`` (``--gym-url``).

    The rest of the gym section stays as the layers set it (``gym_id``, ``seed``,
    ``allowed_media_domains``, and the ``options`` an HTTP client takes: timeouts, retries,
    auth, …). Options only the simulator takes (``screenshot_size``) are dropped from every
    layer; any other unknown option is left for validation to name."""
    sim_only = gym_client_options("sim") - gym_client_options("http")
    kept = []
    for layer in layers:
        values = layer.values
        options = OmegaConf.select(values, "cua.agent.gym.options", default=None)
        if isinstance(options, DictConfig) and sim_only & set(options):
            values = copy.deepcopy(values)
            options = OmegaConf.select(values, "cua.agent.gym.options")
            for key in sim_only & set(options):
                del options[key]
        kept.append(_Layer(layer.origin, values))
    gym = {"kind": "http", "base_url": url}
    return [*kept, _Layer("--gym-url", OmegaConf.create({"cua": {"agent": {"gym": gym}}}))]


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    *,
    gym_url: str | None = None,
) -> LoadedConfig:
    """Load ``path`` (YAML; default ``configs/default.yaml``, the embedded default) over
    AReaL's defaults, apply ``a.b=c`` overrides, validate everything.

    The one loader of every command (``train``, ``evaluate``). A wrong field raises one
    ``ConfigError`` line naming the field, what is allowed there (the nearest known key for
    a typo) and the file or command line that set it. ``gym_url`` (``--gym-url``) makes the
    gym ``kind: http`` at that address and keeps the rest of the config's gym settings that
    apply to an HTTP gym (see ``_with_gym_url``); it wins over ``kind``/``base_url`` overrides."""
    layers = _user_layers(Path(path) if path is not None else default_config_path(), overrides)
    if gym_url is not None:
        layers = _with_gym_url(layers, gym_url)
    _reject_derived(layers)
    schema = OmegaConf.structured(CUATrainConfig)
    try:
        merged = OmegaConf.merge(schema, OmegaConf.create(BASE_LAYER), *(x.values for x in layers))
        areal: CUATrainConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        raise ConfigError(_describe_omegaconf(e, schema, layers)) from None
    try:
        cua = CUASettings.model_validate(areal.cua)
    except ValidationError as e:
        raise ConfigError(f"config error: {_describe(e, layers)}") from None
    derive_sampling(areal, cua.agent.sampling, cua.eval_agent().sampling)
    derive_eval_frequency(areal, cua)
    check_consistency(areal, cua)
    return LoadedConfig(areal=areal, cua=cua)
