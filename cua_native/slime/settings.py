"""What the episode loop takes from slime's arguments, checked before anything runs.

slime hands a rollout function its whole argument namespace. Ours reads two extra keys, set in
the YAML file slime's ``--custom-config-path`` names (slime copies its keys onto ``args``):
``cua_config`` (a cua_native config file, ``configs/*.yaml``) and optionally ``cua_overrides``
(``key=value`` strings, as on ``python -m cua_native.train``'s command line). The agent then
runs with slime's model and sampling, which slime's trainer also uses (its log-probs are taken
at ``--rollout-temperature``): ``--hf-checkpoint`` is the model (tokenizer and processor),
``--rollout-temperature/-top-p/-top-k/-max-response-len`` the per-turn sampling, and
``--n-samples-per-prompt`` the group size.

Checked (``SlimeArgsError``, one line): the cua keys; ``--disable-rewards-normalization`` (the
loop hands slime per-turn rewards already normalised per episode within the group:
``cua_native.rollout.trajectory``; slime's own group normalisation assumes one sample per
episode); ``--rollout-top-p 1`` (slime's trainer then asks for SGLang's top-p replay ids,
which these requests do not return).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cua_native.config import CUASettings, load_config
from cua_native.rollout.config import AgentConfig


class SlimeArgsError(ValueError):
    """slime's arguments cannot run the CUA loop; the message says which and what to set."""


@dataclass(frozen=True, slots=True)
class SlimeSetup:
    """The loop's settings under slime."""

    cua: CUASettings
    agent: AgentConfig
    router_url: str
    """``http://{--sglang-router-ip}:{--sglang-router-port}``."""


def agent_for_slime(
    agent: AgentConfig,
    *,
    model_path: str,
    temperature: float,
    top_p: float,
    top_k: int,
    max_new_tokens: int,
    group_size: int,
) -> AgentConfig:
    """``agent`` with slime's model, sampling and group size, encoding screenshots for SGLang."""
    if top_p != 1.0:
        raise SlimeArgsError(
            f"--rollout-top-p {top_p}: slime's trainer then needs SGLang's top-p replay ids, "
            "which the CUA loop's requests do not ask for; use --rollout-top-p 1"
        )
    if group_size < 1 or max_new_tokens < 1:
        raise SlimeArgsError(
            f"--n-samples-per-prompt ({group_size}) and --rollout-max-response-len "
            f"({max_new_tokens}) must be at least 1"
        )
    sampling = agent.sampling.model_copy(
        update={
            "temperature": float(temperature),
            "top_p": float(top_p),
            "top_k": int(top_k),
            "max_new_tokens": int(max_new_tokens),
            "greedy": False,
        }
    )
    return agent.model_copy(
        update={
            "model_path": model_path,
            "sampling": sampling,
            "group_size": int(group_size),
            "encode_images": True,
        }
    )


def _overrides(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence) and all(isinstance(item, str) for item in value):
        return list(value)
    raise SlimeArgsError("cua_overrides must be a list of 'key=value' strings")


def setup_from_args(args: Any) -> SlimeSetup:
    """The loop's settings from slime's ``args``; ``SlimeArgsError`` or the config loader's
    ``ConfigError`` (one line each) when they cannot run it."""
    path = getattr(args, "cua_config", None)
    if not path:
        raise SlimeArgsError(
            "no cua_config: name a cua_native config file under 'cua_config' in the YAML "
            "that --custom-config-path reads"
        )
    if getattr(args, "rewards_normalization", True):
        raise SlimeArgsError(
            "slime would normalise the CUA loop's rewards a second time, over per-turn samples: "
            "add --disable-rewards-normalization"
        )
    for name in ("hf_checkpoint", "sglang_router_ip", "sglang_router_port"):
        if not getattr(args, name, None):
            raise SlimeArgsError(f"slime's args carry no {name}")
    loaded = load_config(str(path), _overrides(getattr(args, "cua_overrides", None)))
    agent = agent_for_slime(
        loaded.cua.agent,
        model_path=str(args.hf_checkpoint),
        temperature=args.rollout_temperature,
        top_p=getattr(args, "rollout_top_p", 1.0),
        top_k=getattr(args, "rollout_top_k", -1),
        max_new_tokens=args.rollout_max_response_len,
        group_size=args.n_samples_per_prompt,
    )
    return SlimeSetup(
        cua=loaded.cua,
        agent=agent,
        router_url=f"http://{args.sglang_router_ip}:{args.sglang_router_port}",
    )
