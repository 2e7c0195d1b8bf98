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

import difflib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from areal.api.cli_args import GRPOConfig, vLLMConfig
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cua_native.rollout.config import AgentConfig
from cua_native.rollout.dataset import TaskSource


class ConfigError(ValueError):
    """A config file or override is wrong; the message names the field and what is allowed."""


@dataclass
class CUAvLLMConfig(vLLMConfig):
    """AReaL's vLLM server settings plus what CUA needs (passed through as CLI flags).

    Many screenshots per prompt and long histories need a 256k context and 64 images per
    prompt; screenshots given as URLs need their hosts allow-listed (vLLM refuses others).
    """

    max_model_len: int | None = 262144
    limit_mm_per_prompt: str = '{"image": 64}'
    allowed_media_domains: list[str] = field(default_factory=list)


@dataclass
class CUASection:
    """The ``cua`` section as OmegaConf sees it; validated into ``CUASettings``."""

    mode: str = "embedded"
    run_dir: str = "runs/default"
    agent: dict[str, Any] = field(default_factory=dict)
    tasks: dict[str, Any] = field(default_factory=dict)
    eval_tasks: dict[str, Any] | None = None
    baseline: bool = True
    eval_every: int = 0
    eval_episodes_per_task: int = 1
    monitor_db: str | None = "sqlite"
    monitor_url: str | None = None
    monitor_token: str | None = None
    warm_start: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    checkpoint_every: int = 0


@dataclass
class CUATrainConfig(GRPOConfig):
    experiment_name: str = "cua"
    trial_name: str = "default"
    vllm: CUAvLLMConfig = field(default_factory=CUAvLLMConfig)
    cua: CUASection = field(default_factory=CUASection)


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


class CUASettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["embedded", "areal"] = "embedded"
    run_dir: Path = Path("runs/default")
    agent: AgentConfig = Field(default_factory=AgentConfig)
    tasks: TaskSource = Field(default_factory=lambda: TaskSource(split="train"))
    eval_tasks: TaskSource | None = None
    baseline: bool = True
    eval_every: int = Field(0, ge=0)
    eval_episodes_per_task: int = Field(1, ge=1)
    monitor_db: str | None = "sqlite"
    """``sqlite`` = ``<run_dir>/monitor.db``; a SQLAlchemy URL; or null for no store."""
    monitor_url: str | None = None
    monitor_token: str | None = None
    warm_start: WarmStart = Field(default_factory=WarmStart)
    device: str = "cpu"
    checkpoint_every: int = Field(0, ge=0)

    def monitor_db_url(self) -> str | None:
        if self.monitor_db is None:
            return None
        if self.monitor_db == "sqlite":
            return f"sqlite:///{(self.run_dir / 'monitor.db').resolve()}"
        return self.monitor_db


@dataclass(frozen=True)
class LoadedConfig:
    areal: CUATrainConfig
    cua: CUASettings


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


def _describe(error: ValidationError, prefix: str) -> str:
    lines = []
    for item in error.errors():
        where = ".".join(str(p) for p in (prefix, *item["loc"]) if p != "")
        if item["type"] == "extra_forbidden":
            allowed = _fields_at(CUASettings, tuple(item["loc"][:-1]))
            leaf = str(item["loc"][-1])
            close = difflib.get_close_matches(leaf, allowed, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            lines.append(f"{where}: unknown field.{hint} Allowed: {', '.join(allowed)}")
            continue
        got = item.get("input")
        shown = "" if isinstance(got, dict) else f" (got {json.dumps(got, default=str)})"
        lines.append(f"{where}: {item['msg']}{shown}")
    return "; ".join(lines)


def _describe_omegaconf(error: OmegaConfBaseException, schema: Any) -> str:
    """One line: the field, what is wrong, and what is allowed there."""
    key = str(getattr(error, "full_key", "") or "")
    message = str(getattr(error, "msg", error)).splitlines()[0]
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(schema, parent_key) if parent_key else schema
    if "not in" in message and parent is not None and OmegaConf.is_config(parent):
        allowed = sorted(str(k) for k in parent.keys())  # type: ignore[union-attr]
        close = difflib.get_close_matches(leaf, allowed, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        message = f"unknown field '{leaf}'.{hint} Allowed: {', '.join(allowed)}"
    return f"config error at {key or 'top level'}: {message}"


def validate_cua(section: dict[str, Any]) -> CUASettings:
    try:
        return CUASettings.model_validate(section)
    except ValidationError as e:
        raise ConfigError(f"config error: {_describe(e, 'cua')}") from None


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
    sampled, trained = cua.agent.sampling.temperature, areal.actor.temperature
    if not cua.agent.sampling.greedy and abs(sampled - trained) > 1e-9:
        raise ConfigError(
            f"config error: actor.temperature ({trained}) must equal "
            f"cua.agent.sampling.temperature ({sampled}): PPO's ratio compares the trainer's "
            "log-probs with the engine's, which are taken under the sampling temperature"
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
        # the cluster path's findings 2 and 3: groups per step, and the names under which
        # running servers and disk weight updates are found
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
}
"""AReaL fields every CUA run shares; a config file or override replaces any of them."""


def default_config_path() -> Path:
    """``configs/default.yaml``: in a checkout it sits next to the package; a built wheel
    carries it inside the package (``pyproject.toml`` force-includes it)."""
    beside = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"
    if beside.is_file():
        return beside
    return Path(str(resources.files("cua_native").joinpath("configs/default.yaml")))


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> LoadedConfig:
    """Load ``path`` (YAML; default ``configs/default.yaml``, the embedded default) over
    AReaL's defaults, apply ``a.b=c`` overrides, validate everything."""
    if path is None:
        path = default_config_path()
    schema = OmegaConf.structured(CUATrainConfig)
    layers = [schema, OmegaConf.create(BASE_LAYER)]
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config error: no config file at {path}")
        try:
            layers.append(OmegaConf.load(path))
        except Exception as e:  # yaml errors carry line numbers; keep them
            raise ConfigError(f"config error: {path} is not valid YAML: {e}") from None
    if overrides:
        layers.append(OmegaConf.from_dotlist(overrides))
    try:
        merged = OmegaConf.merge(*layers)
        areal: CUATrainConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        raise ConfigError(_describe_omegaconf(e, schema)) from None
    section = {k: v for k, v in OmegaConf.to_container(merged.cua).items() if v is not None}  # type: ignore[union-attr]
    cua = validate_cua(section)
    check_consistency(areal, cua)
    return LoadedConfig(areal=areal, cua=cua)
