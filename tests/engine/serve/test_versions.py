"""AReaL #1569 on our path: a token's version is the one its request was built under.

AReaL 1.0.4's ``RemoteInfEngine.agenerate`` labels an answer's tokens with the engine's version
read *after* the answer came back. Here the trainer's ``set_version`` lands while a request is
in flight (the stand-in's forward pass is held by a gate, so the order is fixed): the weights
that generate are still version 0 (no update ran), and AReaL's own client labels their tokens
1. The workflow (``cua_native.engine.versions``: the checked backends note each request's build
version, the episode pins it) records 0, on both backends; a turn continued after an abort
keeps one label per segment, as upstream's fix does.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from areal.api.cli_args import GenerationHyperparameters
from areal.engine.sglang_remote import RemoteSGLangEngine
from areal.engine.vllm_remote import RemotevLLMEngine

from cua_native.engine.remote import prepare_remote_engine
from cua_native.engine.versions import ServedVersions, served_versions
from cua_native.gym.sim import SimGym
from cua_native.rollout.config import AgentConfig, SamplingConfig
from cua_native.rollout.records import EpisodeContext, EpisodeRecord, TurnRecord
from cua_native.rollout.workflow import CUAAgentWorkflow

GREEDY = GenerationHyperparameters(max_new_tokens=24, greedy=True, ignore_eos=True)
CLIENTS = {"sglang": RemoteSGLangEngine, "vllm": RemotevLLMEngine}


class Turns:
    """An observer keeping every finished turn."""

    def __init__(self) -> None:
        self.turns: list[TurnRecord] = []

    def episode_started(self, context: EpisodeContext) -> None:
        return None

    def turn_finished(self, context: EpisodeContext, turn: TurnRecord) -> None:
        self.turns.append(turn)

    def episode_finished(self, record: EpisodeRecord) -> None:
        return None


async def bump_in_flight(sk: Any, engine: Any, client: Any, work: Any) -> Any:
    """Run ``work`` (a coroutine that generates through ``client``) and, while its request is
    at the server (the 6th forward pass held), announce version 1 the way the trainer does
    (``set_version``); then let the server answer."""
    gate = sk.ForwardGate(engine.model, at=5)
    try:
        running = asyncio.create_task(work)
        await gate.wait_blocked()
        client.set_version(1)
        gate.release()
        return await running
    finally:
        gate.close()


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
async def test_areal_labels_tokens_with_the_version_read_after_the_answer(
    kit: Any, sk: Any, tiny: Any, backend: str
) -> None:
    """The bug, on the client our cluster path runs: AReaL 1.0.4's remote client (its own
    backend) labels version-0 tokens with the version announced during the round trip."""
    engine = kit.engine()
    try:
        with (
            sk.serving(engine, backend) as srv,
            sk.areal_client(CLIENTS[backend], srv.addr) as client,
        ):
            # AReaL's stock SGLang backend cannot send a vision turn (test_sglang): a text one
            made = kit.text_request(GREEDY) if backend == "sglang" else None
            request = sk.on_wire(made or sk.prompt_request(tiny.processor, GREEDY))
            out = await bump_in_flight(sk, engine, client, client.agenerate(request))
        assert engine.get_version() == 0  # the weights that answered: never updated
        assert len(out.output_tokens) == GREEDY.max_new_tokens
        assert out.output_versions == [1] * GREEDY.max_new_tokens
    finally:
        engine.destroy()


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
async def test_the_workflow_labels_tokens_with_the_version_they_were_requested_under(
    kit: Any, sk: Any, tiny: Any, backend: str
) -> None:
    engine = kit.engine()
    gym = SimGym(seed=0)
    observer = Turns()
    config = AgentConfig(
        family="qwen3_vl",
        model_path=str(tiny.path),
        max_turns=1,
        group_size=1,
        infra_retries=0,
        sampling=SamplingConfig(max_new_tokens=24, greedy=True),
    )
    flow = CUAAgentWorkflow(config, gym=gym, processor=tiny.processor, observer=observer)
    row = {"task": (await gym.list_tasks())[0].model_dump_json()}
    try:
        with (
            sk.serving(engine, backend) as srv,
            sk.areal_client(CLIENTS[backend], srv.addr) as client,
        ):
            out = await bump_in_flight(sk, engine, client, flow.arun_episode(client, row))
            assert client.get_version() == 1
        await flow.aclose()
        assert out is not None
        (turn,) = observer.turns
        assert len(turn.output_ids) > 6  # the answer was still being generated at the bump
        assert turn.output_versions == [0] * len(turn.output_ids)
        # and so do the training rows (prompt positions -1)
        versions = out["versions"][0].tolist()
        assert versions[-len(turn.output_ids) :] == [0] * len(turn.output_ids)
    finally:
        engine.destroy()


async def test_a_restarted_turn_is_labelled_with_its_resubmissions_version(
    kit: Any, sk: Any, disk_update: Any
) -> None:
    """A weight update aborts a SGLang turn 6 tokens in, and the announcement lands before the
    client parsed the aborted answer. The project's backend keeps nothing of the partial (a
    restart, ``engine.remote.RestartingSGLangBackend``): the aborted call is recorded with no
    tokens, and the whole answer, built after the update, carries version 1."""
    update = disk_update(1)
    engine = kit.engine()
    try:
        with (
            sk.serving(engine, "sglang") as srv,
            sk.areal_client(RemoteSGLangEngine, srv.addr) as client,
        ):
            assert prepare_remote_engine(client)  # what the workflow does
            request = sk.on_wire(kit.text_request(GREEDY))

            async def generate() -> tuple[Any, ServedVersions]:
                with served_versions() as served:
                    return await client.agenerate(request), served

            gate = sk.ForwardGate(engine.model, at=5)
            aborted = sk.abort_spy(engine)
            try:
                running = asyncio.create_task(generate())
                await gate.wait_blocked()
                client.pause()
                pausing = asyncio.create_task(asyncio.to_thread(client.pause_generation))
                assert await asyncio.to_thread(aborted.wait, sk.WAIT_S)
                client.set_version(1)  # before the aborted answer reached the client
                gate.release()
                await pausing
                await update.apply(client, version=1)
                await asyncio.to_thread(client.continue_generation)
                client.resume()
                out, served = await running
            finally:
                gate.close()
        assert out.output_versions == [1] * GREEDY.max_new_tokens
        assert served.segments == [(0, 0), (1, GREEDY.max_new_tokens)]
        assert served.pinned(out.output_versions) == [1] * GREEDY.max_new_tokens
    finally:
        engine.destroy()


def test_an_engine_that_filled_no_record_keeps_its_versions() -> None:
    """The in-process engine labels every decode step itself: nothing to pin."""
    assert ServedVersions().pinned([3, 3, 4]) == [3, 3, 4]
    record = ServedVersions()
    record.built(2)
    record.answered(2)
    assert record.pinned([5, 5]) == [2, 2]
    assert record.pinned([5, 5, 5]) == [5, 5, 5]  # a record that does not cover the answer
