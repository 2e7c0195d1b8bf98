"""A tiny Qwen3-VL built locally: tokenizer trained with ``tokenizers``, processor, random model.

Nothing is downloaded. The result is a normal Hugging Face model directory (``config.json``,
weights, tokenizer, processor, chat template), so every code path that takes ``--model PATH``
runs unchanged on it: the embedded default, the tests, and the benchmarks.

The tokenizer is byte-level BPE with Qwen's special tokens at the end of the vocabulary, and
the chat template is the one shipped with Qwen3-VL-8B-Instruct
(``qwen3_vl_chat_template.jinja``), so prompts render and tokenize the way a real checkpoint's
do, only with a smaller vocabulary.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import (
        PreTrainedTokenizerBase,
        PreTrainedTokenizerFast,
        Qwen3VLForConditionalGeneration,
        Qwen3VLProcessor,
    )

QWEN_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
"""Qwen2.5/3-VL special tokens, in the order of their ids in the real vocabulary."""

QWEN_ADDED_TEXT_TOKENS: tuple[str, ...] = ("<tool_call>", "</tool_call>", "<think>", "</think>")
"""Added (non-special) tokens: they decode back into the text the parsers read."""


@dataclass(frozen=True, slots=True)
class TinySpec:
    """Sizes of the tiny model. The defaults run a turn in milliseconds on one CPU core."""

    vocab_size: int = 2048
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 4
    head_dim: int = 32
    """Four query and four KV heads of 32: twice the head width and KV heads of the first tiny
    model (16 and 2), which did not read the word that tells two instructions apart; this
    width does (the copy probe of bench/experiments/results/rotary-base/README.md#rotary-base;
    RL from it, bench/experiments/results/one-phone-per-seed/README.md#one-phone-per-seed)."""
    intermediate_size: int = 128
    vision_depth: int = 2
    vision_hidden_size: int = 32
    vision_heads: int = 2
    vision_intermediate_size: int = 64
    rope_theta: float = 10_000.0
    """Rotary base 1e4, not Qwen3-VL's 5e6: at 5e6 most of the 16 rotary pairs turn less than
    once over a prompt's ~800 positions, so attention can hardly tell positions apart
    (bench/experiments/results/rotary-base/README.md#rotary-base); ``bench/experiments/learning_gpu.py``'s model uses 1e4 too."""
    min_pixels: int = 16 * 32 * 32
    max_pixels: int = 128 * 32 * 32
    """Processor pixel budget: a 1080×2400 screenshot becomes 224×512 (112 image tokens). The
    embedded default halves it through its prompt config (``max_pixels: 65536``)."""
    seed: int = 0


def chat_template() -> str:
    """The Qwen3-VL-8B-Instruct chat template (sha256 3636d0f0…a489e4, 5292 bytes)."""
    return (
        resources.files("cua_native.models")
        .joinpath("qwen3_vl_chat_template.jinja")
        .read_text(encoding="utf-8")
    )


def default_corpus() -> list[str]:
    """Text the tokenizer is trained on: GUI-agent prompts, actions and JSON in both dialects."""
    actions = [
        '{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [500, 250]}}',
        '{"name":"mobile_use","arguments":{"action":"swipe","direction":"up"}}',
        '{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [12, 9]}}',
        '{"action": "type", "text": "hello world"}',
        '{"action": "open", "text": "Settings"}',
        '{"action": "system_button", "button": "back"}',
        '{"action": "terminate", "status": "success"}',
        '{"action": "answer", "text": "555-0100"}',
        '{"action": "long_press", "coordinate": [120, 870]}',
        '{"action": "drag", "start_coordinate": [1, 2], "end_coordinate": [3, 4]}',
    ]
    prose = [
        "You are a GUI agent. You are given a task and your action history, with screenshots.",
        "You need to perform the next action to complete the task.",
        "Thought: I need to open the Settings app and turn on Wi-Fi.",
        'Action: "Tap the Wi-Fi toggle."',
        "<thinking>\nThe Wi-Fi toggle is at the top of the list.\n</thinking>",
        "<tool_call>\n{}\n</tool_call>",
        "The user query: Add a contact named Alice with phone 555-0100.",
        "Task progress (You have done the following operation on the current device): Step 1: ",
        "# Tools\n\nYou may call one or more functions to assist with the user query.",
        "Set brightness to 80%. Create a note saying done. Open Contacts. Go back. Go home.",
        "Notes Contacts Settings Clock Calculator Files Shop Wi-Fi Bluetooth Airplane Dark mode",
        "0123456789 ,.:;!?'\"()[]{}<>-_=+*/\\|@#$%^&~` abcdefghijklmnopqrstuvwxyz",
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ 中文 设置 打开 联系人 ü é ß",
    ]
    digits = [f"[{x}, {y}]" for x in range(0, 1000, 37) for y in range(0, 1000, 111)]
    return actions * 20 + prose * 20 + digits


def build_tokenizer(
    corpus: Iterable[str] | None = None, vocab_size: int = 2048
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer with Qwen's special and added tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(QWEN_SPECIAL_TOKENS) - len(QWEN_ADDED_TEXT_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(corpus or default_corpus()), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )
    fast.add_special_tokens({"additional_special_tokens": list(QWEN_SPECIAL_TOKENS)})
    fast.add_tokens(list(QWEN_ADDED_TEXT_TOKENS), special_tokens=False)
    fast.chat_template = chat_template()
    return fast


def build_processor(
    tokenizer: PreTrainedTokenizerBase, spec: TinySpec = TinySpec()
) -> Qwen3VLProcessor:
    """A Qwen3-VL processor (patch 16, merge 2: factor 32) around ``tokenizer``."""
    from transformers import Qwen2VLImageProcessorFast, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    size = {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}
    image_processor = Qwen2VLImageProcessorFast(
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        size=size,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    video_processor = Qwen3VLVideoProcessor(
        patch_size=16, temporal_patch_size=2, merge_size=2, size=dict(size)
    )
    return Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=chat_template(),
    )


def build_model(
    tokenizer: PreTrainedTokenizerBase, spec: TinySpec = TinySpec()
) -> Qwen3VLForConditionalGeneration:
    """A randomly initialised 2-layer Qwen3-VL whose special-token ids match ``tokenizer``."""
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in QWEN_SPECIAL_TOKENS}
    half = spec.head_dim // 2
    mrope = [half - 2 * (half // 4), half // 4, half // 4]
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_hidden_layers": spec.layers,
            "num_attention_heads": spec.heads,
            "num_key_value_heads": spec.kv_heads,
            "head_dim": spec.head_dim,
            "max_position_embeddings": 262144,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": spec.rope_theta,
                "mrope_section": mrope,
                "mrope_interleaved": True,
            },
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "depth": spec.vision_depth,
            "hidden_size": spec.vision_hidden_size,
            "intermediate_size": spec.vision_intermediate_size,
            "num_heads": spec.vision_heads,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": spec.hidden_size,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [spec.vision_depth - 1],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(spec.seed)
    model = Qwen3VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    model.eval()
    return model


def build_tiny_qwen3_vl(
    directory: str | Path, spec: TinySpec = TinySpec(), corpus: Iterable[str] | None = None
) -> Path:
    """Write a complete tiny Qwen3-VL model directory and return its path.

    Loading it back with ``AutoProcessor.from_pretrained`` and
    ``AutoModelForImageTextToText.from_pretrained`` gives the same objects as a real checkpoint.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(corpus, spec.vocab_size)
    processor = build_processor(tokenizer, spec)
    model = build_model(tokenizer, spec)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    (directory / "cua_native_tiny.json").write_text(
        json.dumps(
            {
                "kind": "tiny-qwen3-vl",
                "spec": spec.__dict__
                if hasattr(spec, "__dict__")
                else {f: getattr(spec, f) for f in spec.__slots__},
            },
            indent=2,
        )
    )
    return directory
