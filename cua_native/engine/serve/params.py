"""Sampling parameters of the two wire formats → AReaL ``GenerationHyperparameters``.

SGLang nests them under ``sampling_params`` (``max_new_tokens``, default 128); vLLM's OpenAI
API takes them flat (``max_tokens``, default 16 for completions and "what fits" for chat).
Anything that would change the sampling distribution away from what the in-process engine
implements (penalties, ``min_p``, beam search, several samples) is refused with a clear
message rather than silently ignored. A per-request seed (SGLang ``sampling_seed``, vLLM
``seed``) seeds the request's generator, like the engine's ``metadata["seed"]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from areal.api.cli_args import GenerationHyperparameters

from cua_native.engine.serve.core import RequestError

SGLANG_DEFAULT_MAX_NEW_TOKENS = 128
VLLM_COMPLETIONS_DEFAULT_MAX_TOKENS = 16

_NEUTRAL = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
    "n": 1,
    "best_of": 1,
    "use_beam_search": False,
    "stream": False,
    "echo": False,
}
"""Fields accepted only at their neutral value, and that value."""

_SGLANG_KEYS = frozenset(
    {
        "max_new_tokens",
        "min_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "sampling_seed",
        *_NEUTRAL,
    }
)


def _check_neutral(params: Mapping[str, Any], where: str) -> None:
    for key, neutral in _NEUTRAL.items():
        value = params.get(key)
        if value is not None and value != neutral:
            raise RequestError(
                f"{where}{key}={value!r} is not supported by the stand-in server "
                f"(only {neutral!r}); it would change the sampling distribution"
            )


def _stops(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise RequestError(f"stop must be a string or a list of strings, got {value!r}")


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name} must be an integer, got {value!r}")
    return value


def _gconfig(
    *,
    max_new_tokens: int,
    min_new_tokens: int,
    temperature: Any,
    top_p: Any,
    top_k: Any,
    stop: Any,
    stop_token_ids: Any,
    ignore_eos: Any,
    max_tokens: int,
) -> GenerationHyperparameters:
    temperature = 1.0 if temperature is None else float(temperature)
    ids = [] if stop_token_ids is None else stop_token_ids
    if not isinstance(ids, list):
        raise RequestError(f"stop_token_ids must be a list of integers, got {ids!r}")
    return GenerationHyperparameters(
        n_samples=1,
        max_new_tokens=_int(max_new_tokens, "max_new_tokens"),
        min_new_tokens=_int(min_new_tokens, "min_new_tokens"),
        max_tokens=max_tokens,
        greedy=temperature == 0.0,
        temperature=temperature,
        top_p=1.0 if top_p is None else float(top_p),
        top_k=-1 if top_k is None else _int(top_k, "top_k"),
        stop_token_ids=[_int(t, "stop_token_ids[]") for t in ids],
        ignore_eos=bool(ignore_eos),
        stop=_stops(stop),
    )


def sglang_gconfig(
    sampling_params: Mapping[str, Any] | None, max_context: int
) -> tuple[GenerationHyperparameters, int | None]:
    """SGLang ``sampling_params`` → (gconfig, seed or None)."""
    sp = dict(sampling_params or {})
    unknown = sorted(set(sp) - _SGLANG_KEYS)
    if unknown:
        raise RequestError(f"sampling_params {unknown} are not supported by the stand-in server")
    _check_neutral(sp, "sampling_params.")
    gconfig = _gconfig(
        max_new_tokens=sp.get("max_new_tokens", SGLANG_DEFAULT_MAX_NEW_TOKENS),
        min_new_tokens=sp.get("min_new_tokens") or 0,
        temperature=sp.get("temperature"),
        top_p=sp.get("top_p"),
        top_k=sp.get("top_k"),
        stop=sp.get("stop"),
        stop_token_ids=sp.get("stop_token_ids"),
        ignore_eos=sp.get("ignore_eos"),
        max_tokens=max_context,
    )
    seed = sp.get("sampling_seed")
    return gconfig, None if seed is None else _int(seed, "sampling_seed")


def vllm_gconfig(
    body: Mapping[str, Any], prompt_len: int, max_context: int, default_max_tokens: int | None
) -> tuple[GenerationHyperparameters, int | None]:
    """vLLM's flat OpenAI fields → (gconfig, seed or None). ``default_max_tokens`` None: what
    fits in the context (chat)."""
    _check_neutral(body, "")
    if body.get("prompt_logprobs") is not None:
        raise RequestError("prompt_logprobs is not supported by the stand-in server")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if max_tokens is None:
        max_tokens = default_max_tokens or max(max_context - prompt_len, 1)
    top_k = body.get("top_k")
    gconfig = _gconfig(
        max_new_tokens=max_tokens,
        min_new_tokens=body.get("min_tokens") or 0,
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        top_k=None if top_k in (None, 0) else top_k,
        stop=body.get("stop"),
        stop_token_ids=body.get("stop_token_ids"),
        ignore_eos=body.get("ignore_eos"),
        max_tokens=max_context,
    )
    seed = body.get("seed")
    return gconfig, None if seed is None else _int(seed, "seed")
