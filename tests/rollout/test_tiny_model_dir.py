"""The embedded default's tiny model: a tokenizer that has seen the prompts, and a cache entry
named after what was built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cua_native.models.tiny import build_tokenizer
from cua_native.prompts import mai_ui
from cua_native.rollout.factories import TINY_MODEL_DIRNAME, tiny_model_dir


def test_the_system_prompt_tokenizes_into_words(processor: Any) -> None:
    text = mai_ui.DEFAULT_PROMPT
    ours = len(processor.tokenizer(text)["input_ids"])
    generic = len(build_tokenizer()(text)["input_ids"])
    # roughly a word per token, where the generic corpus leaves it nearly character-level
    assert ours < 0.6 * generic
    assert ours < len(text) / 3.5


def test_cache_entry_is_named_by_the_build_and_reused(tiny_dir: Path) -> None:
    assert (
        tiny_dir.name.startswith(f"{TINY_MODEL_DIRNAME}-")
        and len(tiny_dir.name) == len(TINY_MODEL_DIRNAME) + 13
    )
    assert tiny_model_dir(tiny_dir.parent) == tiny_dir


def test_the_rotary_base_is_the_specs() -> None:
    from cua_native.models.tiny import TinySpec, build_model

    tokenizer = build_tokenizer()
    default = build_model(tokenizer, TinySpec(layers=1))
    qwen = build_model(tokenizer, TinySpec(layers=1, rope_theta=5_000_000.0))
    assert default.config.text_config.rope_parameters["rope_theta"] == 10_000.0
    assert qwen.config.text_config.rope_parameters["rope_theta"] == 5_000_000.0
    # the rotary module turns head_dim / 2 = 16 pairs at theta ** (-2i / 32)
    inv_freq = default.model.language_model.rotary_emb.inv_freq
    assert inv_freq.shape == (16,)
    assert abs(float(inv_freq[1]) - 10_000.0**-0.0625) < 1e-6
    assert float(qwen.model.language_model.rotary_emb.inv_freq[1]) < float(inv_freq[1])
