"""The policy side of an episode: what turns a screen and a history into a model request, and
the model's output tokens into text and an action.

An ``Agent`` is shared by the concurrent episodes of a workflow (it holds no per-episode state);
the ``Episode`` owns the environment side and calls the engine. This is the split of
tinker-cookbook's ``do_single_rollout(policy, env)``: the environment never sees tokens, the
agent never sees an execution.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from areal.api.cli_args import GenerationHyperparameters

from cua_native.actions.dialects import Dialect
from cua_native.actions.errors import ParsedOutput
from cua_native.gym.protocol import Screenshot, StepResult, Task
from cua_native.prompts import BuiltPrompt, HistoryStep, PreparedImage
from cua_native.rollout.config import AgentConfig


class TurnBuilder(Protocol):
    """The part of ``cua_native.prompts.PromptBuilder`` an agent uses."""

    async def build_turn(
        self,
        task: Task,
        history: Sequence[HistoryStep],
        current: Screenshot | PreparedImage,
        gconfig: GenerationHyperparameters,
    ) -> BuiltPrompt: ...


class Agent:
    """Prompt builder, dialect, tokenizer and sampling settings of one model family."""

    def __init__(
        self,
        builder: TurnBuilder,
        dialect: Dialect,
        tokenizer: Any,
        gconfig: GenerationHyperparameters,
        config: AgentConfig,
    ) -> None:
        self.builder = builder
        self.dialect = dialect
        self.tokenizer = tokenizer
        self.gconfig = gconfig
        self.config = config
        self.token_texts = TokenTexts(tokenizer)
        self.stop_ids = list(gconfig.stop_token_ids)

    async def prompt(
        self, task: Task, history: Sequence[HistoryStep], screen: Screenshot | PreparedImage
    ) -> BuiltPrompt:
        """This turn's request (exact ids, images) and the prepared current screenshot."""
        return await self.builder.build_turn(task, list(history), screen, self.gconfig)

    def read(self, output_ids: list[int], image_size: tuple[int, int]) -> tuple[str, ParsedOutput]:
        """The model's text (without its stop token) and the action parsed from it."""
        text = decode_output(self.tokenizer, output_ids, self.stop_ids)
        return text, self.dialect.parse(text, image_size=image_size)


def decode_output(tokenizer: Any, output_ids: list[int], stop_ids: list[int]) -> str:
    """The model's text: the output without its final stop token."""
    ids = output_ids[:-1] if output_ids and output_ids[-1] in stop_ids else output_ids
    return str(tokenizer.decode(ids, skip_special_tokens=False))


def token_texts_of(tokenizer: Any, token_ids: list[int]) -> list[str]:
    """Each token decoded on its own (what the monitor shows next to its log-prob); through the
    Rust backend in one call when the tokenizer has one (HF's ``batch_decode`` pays Python
    overhead per token, on the event loop). HF's own path is kept for tokenizers that clean up
    spaces after decoding, which the backend does not do."""
    singles = [[t] for t in token_ids]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return list(backend.decode_batch(singles, skip_special_tokens=False))
    return list(tokenizer.batch_decode(singles))


class TokenTexts:
    """``token_texts_of`` with each id's text decoded once (a vocabulary's worth at most)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token_ids: list[int]) -> list[str]:
        texts = self._texts
        missing = [t for t in dict.fromkeys(token_ids) if t not in texts]
        if missing:
            # Concurrent callers may decode the same id; the text is the same.
            texts.update(zip(missing, token_texts_of(self.tokenizer, missing), strict=True))
        return [texts[t] for t in token_ids]


def feedback_for(parsed: ParsedOutput, step: StepResult | None) -> str | None:
    """What the model is told about its last turn at the start of the next one."""
    if parsed.error is not None:
        return f"Your last output could not be parsed ({parsed.error.kind}): {parsed.error.message}"
    if step is None:
        return None
    if not step.ok:
        return f"The action failed: {step.error or 'refused by the environment'}"
    return step.feedback
