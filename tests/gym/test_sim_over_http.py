"""The embedded simulator served over HTTP and driven by the HTTP client, end to end."""

from __future__ import annotations

from cua_native.actions.models import EPISODE_ENDING, Click, SystemButton
from cua_native.gym.http import HttpGym
from cua_native.gym.server import create_app
from cua_native.gym.sim import SimGym
from cua_native.gym.wire import png_size


async def test_sim_over_http(serve) -> None:
    sim = SimGym(seed=0, width=1080, height=2400)
    app = create_app({sim.gym_id: sim})
    async with serve(app) as url:
        gym = HttpGym(url, sim.gym_id, idempotent_create=True)
        try:
            tasks = await gym.list_tasks()
            assert [t.task_id for t in tasks] == [t.task_id for t in await sim.list_tasks()]
            execution = await gym.start(tasks[0])
            try:
                assert execution.device == {"width": 1080, "height": 2400}
                obs = await execution.observe()
                assert obs.screenshot.png is not None
                assert png_size(obs.screenshot.png) == (obs.width, obs.height) == (1080, 2400)
                assert (await execution.act(Click(x=0.5, y=0.5))).ok
                assert (await execution.act(SystemButton(button="home"))).ok
                evaluation = await execution.evaluate()
                assert 0.0 <= evaluation.reward <= 1.0 and not evaluation.success
            finally:
                await execution.close()
            assert sim.live_executions == 0, "terminate over HTTP closes the simulator's execution"
        finally:
            await gym.aclose()


async def test_a_solution_played_over_http_succeeds(serve) -> None:
    """Actions travel as canonical JSON through the real server; the sim's own solver (read on
    the server side) picks them; success is judged by the sim's validators."""
    sim = SimGym(seed=3)
    app = create_app({sim.gym_id: sim})
    async with serve(app) as url:
        gym = HttpGym(url, sim.gym_id)
        try:
            task = await gym.get_task("sim-018")  # add a contact: taps, typing, save
            execution = await gym.start(task)
            try:
                server_side = sim._live[execution.execution_id]
                for _ in range(task.max_steps or 20):
                    step = server_side.solution_step()
                    assert step is not None
                    assert (await execution.act(step[0])).ok
                    if step[0].type in EPISODE_ENDING:
                        break
                evaluation = await execution.evaluate()
                assert evaluation.success and evaluation.reward == 1.0
                assert all(v.passed for v in evaluation.validators)
            finally:
                await execution.close()
        finally:
            await gym.aclose()
