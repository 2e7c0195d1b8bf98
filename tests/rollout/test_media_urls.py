"""Screenshot URLs end to end (docs/contracts.md#media-allow-list): the workflow and
``evaluate`` give the prompt builder an HTTP client and the run's one allow-list
(``cua.agent.gym.allowed_media_domains``), and every fetch goes through ``gym.media``'s SSRF
rules. A real loopback server serves the screenshots as
PNG links, the way a gym hands out presigned object-store URLs."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import io
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from areal.utils import stats_tracker
from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response, StreamingResponse

from cua_native.actions.models import Answer, Click
from cua_native.evaluate import CountingGym
from cua_native.gym.media import DEFAULT_MAX_BYTES
from cua_native.gym.protocol import Execution, Gym, Observation, Screenshot, Task
from cua_native.gym.sim import SimGym
from cua_native.rollout.config import AgentConfig, GymConfig
from cua_native.rollout.dataset import task_row
from cua_native.rollout.factories import MEDIA_TIMEOUT_S, make_agent
from cua_native.rollout.workflow import CUAAgentWorkflow, workflow_kwargs
from cua_native.training.embedded.evaluation import Evaluation


class MediaServer:
    """Serves PNGs the URL gym stores; ``/redirect`` sends to ``localhost`` (another host),
    ``/huge`` streams one byte over the fetch cap."""

    def __init__(self) -> None:
        self.pngs: dict[str, bytes] = {}
        self.fetched: list[str] = []
        self.base = ""
        app = FastAPI()

        @app.get("/shots/{key}.png")
        async def shot(key: str) -> Response:
            self.fetched.append(key)
            return Response(self.pngs[key], media_type="image/png")

        @app.get("/redirect/{key}.png")
        async def redirect(key: str) -> RedirectResponse:
            port = self.base.rsplit(":", 1)[1]
            return RedirectResponse(f"http://localhost:{port}/shots/{key}.png")

        @app.get("/huge/{key}.png")
        async def huge(key: str) -> StreamingResponse:
            async def body() -> AsyncIterator[bytes]:
                chunk = b"\0" * (1 << 20)
                for _ in range(DEFAULT_MAX_BYTES // len(chunk)):
                    yield chunk
                yield b"\0"

            return StreamingResponse(body(), media_type="image/png")

        self.app = app


@contextlib.asynccontextmanager
async def media_server() -> AsyncIterator[MediaServer]:
    media = MediaServer()
    server = uvicorn.Server(
        uvicorn.Config(media.app, host="127.0.0.1", port=0, log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(6000):  # bounded: up to ~60 s under load
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "the media server did not start"
        media.base = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        yield media
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=60)


class UrlGym:
    """The simulator, with every screenshot handed out as a link to ``media`` (``route``)."""

    def __init__(self, media: MediaServer, route: str = "shots") -> None:
        self.inner = SimGym(seed=0)
        self.gym_id = self.inner.gym_id
        self.media = media
        self.route = route

    def link(self, observation: Observation) -> Observation:
        buffer = io.BytesIO()
        assert observation.screenshot.image is not None
        observation.screenshot.image.save(buffer, format="PNG")
        key = f"s{len(self.media.pngs)}"
        self.media.pngs[key] = buffer.getvalue()
        url = f"{self.media.base}/{self.route}/{key}.png"
        return dataclasses.replace(observation, screenshot=Screenshot(url=url))

    async def list_tasks(self) -> list[Task]:
        return await self.inner.list_tasks()

    async def get_task(self, task_id: str) -> Task:
        return await self.inner.get_task(task_id)

    async def start(self, task: Task, options: dict[str, Any] | None = None) -> Execution:
        return _UrlExecution(await self.inner.start(task, options), self)  # type: ignore[return-value]

    async def aclose(self) -> None:
        await self.inner.aclose()


class _UrlExecution:
    def __init__(self, inner: Execution, gym: UrlGym) -> None:
        self.inner, self.gym = inner, gym
        self.execution_id, self.task = inner.execution_id, inner.task

    async def observe(self) -> Observation:
        return self.gym.link(await self.inner.observe())

    async def act(self, action: Any) -> Any:
        step = await self.inner.act(action)
        if step.observation is None:
            return step
        return dataclasses.replace(step, observation=self.gym.link(step.observation))

    async def evaluate(self, answer: str | None = None) -> Any:
        return await self.inner.evaluate(answer)

    async def close(self) -> None:
        await self.inner.close()


def click_then_answer(turn: int) -> Any:
    return Click(x=0.5, y=0.5) if turn == 0 else Answer(text="done")


def agent_and_engine(
    domains: list[str], processor: Any, scripted_engine_factory: Any
) -> tuple[AgentConfig, Any]:
    """Two turns (click, answer) with ``domains`` as the run's allow-list."""
    config = AgentConfig(
        max_turns=2,
        group_size=1,
        infra_retries=0,
        gym=GymConfig(allowed_media_domains=domains),
    )
    dialect = make_agent(config, processor).dialect
    return config, scripted_engine_factory(dialect, click_then_answer)


async def test_workflow_fetches_allowed_screenshot_urls(
    processor: Any, scripted_engine_factory: Any
) -> None:
    config, engine = agent_and_engine(["127.0.0.1"], processor, scripted_engine_factory)
    async with media_server() as media:
        gym: Gym = UrlGym(media)
        # the cluster path builds the workflow from serializable kwargs: the list travels in them
        workflow = CUAAgentWorkflow(**workflow_kwargs(config), gym=gym, processor=processor)
        task = (await gym.list_tasks())[0]
        out = await workflow.arun_episode(engine, {"task": task.model_dump_json()})
        resources = await workflow._resources()
        http = resources.http
        assert isinstance(http, httpx.AsyncClient)
        assert resources.agent.builder._http is http  # type: ignore[attr-defined]
        assert http.timeout.read == http.timeout.connect == MEDIA_TIMEOUT_S
        await workflow.aclose()
    assert out is not None and out["input_ids"].shape[0] == 2  # two turns, both from URLs
    assert media.fetched == ["s0", "s1"]
    assert http.is_closed  # the workflow's resources closed it


@pytest.mark.parametrize(
    ("domains", "route", "fetched"),
    [
        (["example.com"], "shots", []),  # host not listed: nothing is fetched
        ([], "shots", []),  # no list: no client, and the host is named as refused
        (["*.0.1"], "shots", []),  # a wildcard never opens a private address
        (["127.0.0.1"], "redirect", []),  # the redirect's host (localhost) is not listed
        (["127.0.0.1"], "huge", []),  # over the size cap
    ],
    ids=["not_listed", "no_list", "private_by_wildcard", "redirect", "size_cap"],
)
async def test_workflow_refuses_screenshot_urls_outside_the_rules(
    processor: Any, scripted_engine_factory: Any, domains: list[str], route: str, fetched: list
) -> None:
    config, engine = agent_and_engine(domains, processor, scripted_engine_factory)
    tracker = stats_tracker.get("rollout")
    tracker.export(reset=True)
    async with media_server() as media:
        gym = UrlGym(media, route)
        workflow = CUAAgentWorkflow(config, gym=gym, processor=processor)
        task = (await gym.list_tasks())[0]
        out = await workflow.arun_episode(engine, {"task": task.model_dump_json()})
        await workflow.aclose()
    assert out is None
    assert media.fetched == fetched
    assert tracker.export(reset=True)["rollout/cua/rejected_groups/prompt__count"] == 1


async def test_evaluate_gives_the_builder_a_client(
    processor: Any, scripted_engine_factory: Any
) -> None:
    config, engine = agent_and_engine(["127.0.0.1"], processor, scripted_engine_factory)
    async with media_server() as media:
        gym = CountingGym(UrlGym(media))  # type: ignore[arg-type]
        tasks = (await gym.list_tasks())[:1]
        evaluation = Evaluation(
            agent=config.model_copy(update={"group_size": 2}),
            tasks=tasks,
            gym=gym,
            processor=processor,
            task_row=functools.partial(task_row, gym_id=gym.gym_id),
            model_name="scripted",
        )
        result = await evaluation.run(engine, kind="baseline")
    assert (result.total.completed, result.total.rejected, result.failed_groups) == (2, 0, 0)
    assert gym.leaked == 0
    assert len(media.fetched) == 4
