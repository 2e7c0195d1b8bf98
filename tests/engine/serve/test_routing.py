"""One request id per episode: AReaL 1.0.4's remote engine (its own ``rid`` routing, run here)
sends every turn of an episode to the same server."""

from __future__ import annotations

from typing import Any

from areal.engine.sglang_remote import RemoteSGLangEngine

from cua_native.gym.sim import SimGym
from cua_native.rollout.config import AgentConfig, SamplingConfig
from cua_native.rollout.workflow import CUAAgentWorkflow


class Turns:
    def __init__(self) -> None:
        self.prompts: list[list[int]] = []
        self.episodes: list[str] = []

    def episode_started(self, context: Any) -> None:
        return None

    def turn_finished(self, context: Any, turn: Any) -> None:
        self.prompts.append(list(turn.prompt_ids))
        self.episodes.append(context.episode_id)

    def episode_finished(self, record: Any) -> None:
        return None


async def test_every_turn_of_an_episode_goes_to_one_server(kit: Any, sk: Any, tiny: Any) -> None:
    """Two servers behind one AReaL client (round robin for new request ids): the three turns
    of an episode all reach the server its first turn reached; two episodes in a row take
    turns on the servers, so routing is by the episode, not by chance."""
    config = AgentConfig(
        family="qwen3_vl",
        model_path=str(tiny.path),
        max_turns=3,
        group_size=1,
        infra_retries=0,
        sampling=SamplingConfig(max_new_tokens=4, greedy=True),
    )
    observer, gym = Turns(), SimGym(seed=0)
    flow = CUAAgentWorkflow(config, gym=gym, processor=tiny.processor, observer=observer)
    tasks = (await gym.list_tasks())[:2]  # two tasks: no prompt of one is the other's
    engines = [kit.engine(), kit.engine()]
    try:
        with (
            sk.serving(engines[0], "sglang") as one,
            sk.serving(engines[1], "sglang") as two,
            sk.areal_client(RemoteSGLangEngine, [one.addr, two.addr]) as client,
        ):
            spies = [sk.GenerateSpy(one.served), sk.GenerateSpy(two.served)]
            for task in tasks:
                await flow.arun_episode(client, {"task": task.model_dump_json()})
        await flow.aclose()
    finally:
        for engine in engines:
            engine.destroy()
    served_by: dict[str, set[int]] = {}
    for prompt, episode in zip(observer.prompts, observer.episodes, strict=True):
        servers = {i for i, spy in enumerate(spies) if prompt in spy.entered}
        assert len(servers) == 1
        served_by.setdefault(episode, set()).update(servers)
    turns = {e: observer.episodes.count(e) for e in served_by}
    assert len(turns) == 2 and min(turns.values()) >= 2, turns
    assert all(len(s) == 1 for s in served_by.values()), served_by
    assert set.union(*served_by.values()) == {0, 1}  # the second episode: the other server
