"""``python -m cua_native.gym.server`` as a real process, with a fault profile."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from cua_native.actions.models import Click
from cua_native.gym.http import GymTimeouts, HttpGym, RetryPolicy

HERE = Path(__file__).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120  # a loaded machine imports slowly
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
        try:
            if httpx.get(f"{url}/api/v1/toy/tasks", timeout=1).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("server did not start in 120 s")


async def _episode(url: str) -> float:
    gym = HttpGym(
        url,
        "toy",
        # generous: the server is another process on a possibly loaded machine
        timeouts=GymTimeouts(connect=30, read=60, create=60, act=60, evaluate=60, terminate=60),
        retries=RetryPolicy(attempts=8, backoff_s=0.01),
        idempotent_create=True,
    )
    try:
        execution = await gym.start(await gym.get_task("task-001"))
        try:
            await execution.observe()
            await execution.act(Click(x=0.5, y=0.5))
            return (await execution.evaluate()).reward
        finally:
            await execution.close()
    finally:
        await gym.aclose()


def test_cli_serves_a_gym_with_faults(tmp_path: Path) -> None:
    profile = tmp_path / "faults.json"
    profile.write_text(json.dumps({"seed": 2, "error_share": {"observation": 0.5}}))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "cua_native.gym.server", "--port", str(port)]
    command += [
        "--gym",
        "fakes.counter_gym:CounterGym",
        "--seed",
        "3",
        "--fault-profile",
        str(profile),
    ]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        _wait_ready(url, process)
        assert asyncio.run(_episode(url)) == 1.0
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=120)  # a loaded machine shuts down slowly too
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode == 0, process.stderr.read().decode() if process.stderr else ""
