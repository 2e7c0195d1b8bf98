"""The cluster workflow on AReaL 1.0.4's own remote clients against the stand-in server.

vLLM chat abort (docs/contracts.md#vllm-chat-abort): ``CUAAgentWorkflow.arun_episode``
prepares the ``RemotevLLMEngine`` it is given, so a vision turn aborted by a weight update is
restarted under the new weights: the recorded turn is the new model's answer, never
``partial + restart``.
Server prompt check (docs/contracts.md#server-prompt-check): a server that built another
prompt than the builder's ids (count, or ids where vLLM returns them) rejects the episode as
``token_mismatch``, counted in the stats.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from areal.api.io_struct import ModelRequest, ModelResponse
from areal.engine.sglang_remote import RemoteSGLangEngine
from areal.engine.vllm_remote import RemotevLLMEngine
from areal.utils import stats_tracker

from cua_native.engine.remote import CheckedSGLangBackend, CheckedVLLMBackend
from cua_native.engine.serve import vllm_api
from cua_native.engine.serve.chat import chat_prompt
from cua_native.gym.sim import SimGym
from cua_native.rollout.config import AgentConfig, SamplingConfig
from cua_native.rollout.records import EpisodeContext, EpisodeRecord, TurnRecord
from cua_native.rollout.workflow import CUAAgentWorkflow


class Turns:
    """An observer keeping every finished turn and episode."""

    def __init__(self) -> None:
        self.turns: list[TurnRecord] = []
        self.records: list[EpisodeRecord] = []

    def episode_started(self, context: EpisodeContext) -> None:
        return None

    def turn_finished(self, context: EpisodeContext, turn: TurnRecord) -> None:
        self.turns.append(turn)

    def episode_finished(self, record: EpisodeRecord) -> None:
        self.records.append(record)


def workflow(tiny: Any, max_new_tokens: int) -> tuple[CUAAgentWorkflow, Turns, SimGym]:
    config = AgentConfig(
        family="qwen3_vl",
        model_path=str(tiny.path),
        max_turns=1,
        group_size=1,
        infra_retries=0,
        sampling=SamplingConfig(max_new_tokens=max_new_tokens, greedy=True),
    )
    observer, gym = Turns(), SimGym(seed=0)
    flow = CUAAgentWorkflow(config, gym=gym, processor=tiny.processor, observer=observer)
    return flow, observer, gym


async def task_row(gym: SimGym) -> dict[str, Any]:
    return {"task": (await gym.list_tasks())[0].model_dump_json()}


async def test_workflow_restarts_a_vision_turn_aborted_by_a_weight_update(
    kit: Any, sk: Any, tiny: Any, disk_update: Any
) -> None:
    update = disk_update(3)
    new, engine = kit.engine(), kit.engine()
    new.update_weights_from_disk(update.path).result()
    try:
        # the new model's own answer to this turn (same task, same screen, same prompt)
        flow, expected, gym = workflow(tiny, max_new_tokens=24)
        assert await flow.arun_episode(new, await task_row(gym)) is not None
        await flow.aclose()
        answer = expected.turns[0].output_ids
        assert len(answer) > 6  # long enough to be cut after 6 tokens

        flow, seen, gym = workflow(tiny, max_new_tokens=24)
        row = await task_row(gym)
        with (
            sk.serving(engine, "vllm") as srv,
            sk.areal_client(RemotevLLMEngine, srv.addr) as client,
        ):
            spy = sk.GenerateSpy(srv.served)
            gate = sk.ForwardGate(engine.model, at=5)
            aborted = sk.abort_spy(engine)
            try:
                running = asyncio.create_task(flow.arun_episode(client, row))
                await gate.wait_blocked()  # the workflow's turn, 6 tokens in
                backend = client._engine.backend
                assert isinstance(backend, CheckedVLLMBackend)  # installed by arun_episode
                client.pause()
                pausing = asyncio.create_task(asyncio.to_thread(client.pause_generation))
                assert await asyncio.to_thread(aborted.wait, sk.WAIT_S)
                gate.release()
                await pausing
                await update.apply(client, version=1)
                await asyncio.to_thread(client.continue_generation)
                client.resume()
                out = await running
            finally:
                gate.close()
            assert out is not None
            # a second episode on the same client keeps the same backend (idempotent)
            assert await flow.arun_episode(client, row) is not None
            assert client._engine.backend is backend
        await flow.aclose()
        turn = seen.turns[0]
        assert spy.answered[:2] == [("abort", 6), (turn.stop_reason, len(answer))]
        assert turn.output_ids == answer  # the new model's answer, whole
        assert turn.output_ids[:6] + answer[: len(answer) - 6] != turn.output_ids
        assert turn.output_versions == [1] * len(answer)
        assert turn.output_logprobs == pytest.approx(expected.turns[0].output_logprobs, abs=1e-5)
        assert not turn.token_mismatch and turn.prompt_checked
    finally:
        new.destroy()
        engine.destroy()


def _stats() -> Any:
    tracker = stats_tracker.get("rollout")
    tracker.export(reset=True)
    return tracker


async def _episode_on(
    sk: Any, tiny: Any, engine: Any, backend: str, client_cls: type, lying: bool
) -> tuple[dict[str, Any] | None, Turns, dict[str, float], type]:
    flow, seen, gym = workflow(tiny, max_new_tokens=4)
    row = await task_row(gym)
    tracker = _stats()
    with sk.serving(engine, backend) as srv, sk.areal_client(client_cls, srv.addr) as client:
        if lying:
            tell_another_prompt(srv.served)
        out = await flow.arun_episode(client, row)
        installed = type(client._engine.backend)
    await flow.aclose()
    return out, seen, tracker.export(reset=True), installed


def tell_another_prompt(served: Any) -> None:
    """SGLang stand-in that reports one prompt token more than it was sent (as a server that
    expanded an image into more tokens would)."""
    original = served.generate

    async def generate(req: ModelRequest) -> ModelResponse:
        resp = await original(req)
        return dataclasses.replace(resp, input_tokens=[*resp.input_tokens, 0])

    served.generate = generate


@pytest.mark.parametrize("lying", [False, True], ids=["same", "other_count"])
async def test_sglang_prompt_count_is_checked(kit: Any, sk: Any, tiny: Any, lying: bool) -> None:
    engine = kit.engine()
    try:
        out, seen, stats, installed = await _episode_on(
            sk, tiny, engine, "sglang", RemoteSGLangEngine, lying
        )
    finally:
        engine.destroy()
    assert installed is CheckedSGLangBackend
    (turn,) = seen.turns
    (record,) = seen.records
    if not lying:
        assert out is not None and not turn.token_mismatch and turn.prompt_checked
        assert record.outcome == "completed"
        assert stats["rollout/cua/token_mismatches"] == 0.0
        assert stats["rollout/cua/prompt_checks"] == 1.0
        return
    assert out is None  # the group is rejected: its turn came from another prompt
    assert turn.token_mismatch
    assert record.outcome == "rejected" and record.reject_reason == "token_mismatch"
    assert stats["rollout/cua/rejected_episodes/token_mismatch__count"] == 1
    assert stats["rollout/cua/rejected_groups/token_mismatch__count"] == 1


async def test_vllm_server_that_templates_otherwise_is_caught_by_its_ids(
    kit: Any, sk: Any, tiny: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vLLM stand-in builds its chat prompt with one extra token in front (as a server with
    another chat template would) and generates from it: ``prompt_token_ids`` differ from the
    builder's ids although AReaL's response says ``input_tokens == req.input_ids``."""

    def templated_otherwise(*args: Any, **kwargs: Any) -> Any:
        prompt = chat_prompt(*args, **kwargs)
        return dataclasses.replace(prompt, input_ids=[prompt.input_ids[0], *prompt.input_ids])

    engine = kit.engine()
    try:
        out, seen, stats, installed = await _episode_on(
            sk, tiny, engine, "vllm", RemotevLLMEngine, lying=False
        )
        assert out is not None and not seen.turns[0].token_mismatch
        assert seen.turns[0].prompt_checked and stats["rollout/cua/prompt_checks"] == 1.0
        monkeypatch.setattr(vllm_api, "chat_prompt", templated_otherwise)
        out, seen, stats, installed = await _episode_on(
            sk, tiny, engine, "vllm", RemotevLLMEngine, lying=False
        )
    finally:
        engine.destroy()
    assert installed is CheckedVLLMBackend
    assert out is None
    (turn,) = seen.turns
    assert turn.token_mismatch
    (record,) = seen.records
    assert record.reject_reason == "token_mismatch"
    assert stats["rollout/cua/rejected_groups/token_mismatch__count"] == 1
