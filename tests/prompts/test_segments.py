"""``SegmentTokenizer`` gives the tokenizer's ids exactly, and refuses tokenizers where it could
not (``for_tokenizer`` returns ``None`` and prompts are tokenized whole)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, normalizers, processors

from cua_native.prompts.segments import SegmentTokenizer, probe_text

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|image_pad|>", "<|vision_start|>", "<|vision_end|>"]
TEXT = st.lists(
    st.sampled_from(
        [*'ab <|>\n\t{}":,1é😀点', "e\u0301", "  ", "<tool_call>", "</think>", "im_end"]
    ),
    max_size=30,
).map("".join)
PIECES = st.lists(st.one_of(TEXT, st.sampled_from(SPECIALS)), max_size=12)


@pytest.fixture(scope="module", params=["tiny", "nfc"])
def tokenizer(request: pytest.FixtureRequest, processor):
    """The tiny tokenizer, and one with Qwen2's NFC normalizer (pieces are normalised on their
    own by the library, so the cut must still be exact)."""
    if request.param == "tiny":
        return processor.tokenizer
    return _with_backend(processor, lambda b: setattr(b, "normalizer", normalizers.NFC()))


@given(pieces=PIECES)
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_segments_equal_whole_text_tokenization(tokenizer, pieces: list[str]) -> None:
    segmented = SegmentTokenizer.for_tokenizer(tokenizer)
    assert segmented is not None
    text = "".join(pieces)
    expected = tokenizer(text)["input_ids"]
    assert segmented.encode(text) == expected
    assert segmented.encode(text) == expected  # from the cache, the same


def test_a_rendered_prompt_is_looked_up_piece_by_piece(processor) -> None:
    tokenizer = processor.tokenizer
    segmented = SegmentTokenizer.for_tokenizer(tokenizer)
    assert segmented is not None
    system = "You are a phone agent. " * 50
    turn = lambda n: (  # noqa: E731
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nturn {n} "
        "<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n<|im_start|>assistant\n"
    )
    segmented.encode(turn(1))
    before = segmented._piece_ids.cache_info()
    assert segmented.encode(turn(2)) == tokenizer(turn(2))["input_ids"]
    after = segmented._piece_ids.cache_info()
    assert after.misses - before.misses == 1  # only "user\nturn 2 " is new
    assert after.hits > before.hits


def _with_backend(processor, change):
    tokenizer = copy.deepcopy(processor.tokenizer)
    change(tokenizer.backend_tokenizer)
    return tokenizer


def test_refused_when_an_added_token_strips_whitespace(processor) -> None:
    tokenizer = _with_backend(
        processor,
        lambda backend: backend.add_special_tokens([AddedToken("<|strip|>", lstrip=True)]),
    )
    assert SegmentTokenizer.for_tokenizer(tokenizer) is None


def test_refused_when_post_processing_adds_tokens(processor) -> None:
    def add_bos(backend) -> None:
        bos = backend.token_to_id("<|endoftext|>")
        backend.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)]
        )

    assert SegmentTokenizer.for_tokenizer(_with_backend(processor, add_bos)) is None


def test_refused_when_the_probe_disagrees(processor) -> None:
    class Disagreeing:
        """A tokenizer whose whole-text ids differ from its pieces' (e.g. a Python-side rule)."""

        backend_tokenizer = processor.tokenizer.backend_tokenizer

        def __call__(self, text: str) -> dict[str, list[int]]:
            return {"input_ids": [0, *processor.tokenizer(text)["input_ids"]]}

    assert SegmentTokenizer.for_tokenizer(Disagreeing()) is None


def test_probe_holds_every_token_twice() -> None:
    probe = probe_text(SPECIALS)
    assert all(probe.count(token + token) == 1 for token in SPECIALS)


def test_not_for_tokenizers_without_a_rust_backend() -> None:
    class PythonTokenizer:
        def __call__(self, text: str) -> dict[str, list[int]]:
            return {"input_ids": [ord(c) for c in text]}

    assert SegmentTokenizer.for_tokenizer(PythonTokenizer()) is None
