"""``ScriptedEngine``: an engine that answers each turn with a scripted action, formatted
by the agent's own dialect, with fixed log-probs (no model)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from areal.api.io_struct import ModelRequest, ModelResponse

from cua_native.actions.models import Action


class ScriptedEngine:
    """A real ``agenerate`` for tests: answers each episode's n-th call with ``script(n)``
        written in the dialect's own format and tokenized, so the loop parses and executes it
        exactly as model output. Per-token logprobs are a fixed value (no model behind it). Every
    request is kept in ``requests``, in the order received (the conformance tests read the prompts
    the workflow sent)."""

    def __init__(
        self,
        tokenizer: Any,
        dialect: Any,
        script: Callable[[int], Action | str],
        stop_id: int,
        latency: float = 0.0,
        thought: str = "go",
        logprob: float = -0.5,
    ) -> None:
        self.tokenizer = tokenizer
        self.dialect = dialect
        self.script = script
        self.stop_id = stop_id
        self.latency = latency
        self.thought = thought
        self.logprob = logprob
        self.calls: dict[str, int] = {}
        self.requests: list[ModelRequest] = []

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        self.requests.append(req)
        episode = str(req.metadata.get("episode_id", ""))
        turn = self.calls.get(episode, 0)
        self.calls[episode] = turn + 1
        if self.latency:
            await asyncio.sleep(self.latency)
        step = self.script(turn)
        text = step if isinstance(step, str) else self.dialect.format(step, thought=self.thought)
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.stop_id]
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=ids,
            output_logprobs=[self.logprob] * len(ids),
            output_versions=[0] * len(ids),
            stop_reason="stop",
            tokenizer=req.tokenizer,
            processor=req.processor,
        )
