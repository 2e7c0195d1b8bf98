"""``python -m cua_native.slime buffer|tasks``: the Rollout Buffer, and a config's tasks as slime
prompt data.

    python -m cua_native.slime buffer --config configs/qwen3_vl_android.yaml [--host H] [--port 8889] [key=value ...]
    python -m cua_native.slime tasks --config configs/qwen3_vl_android.yaml --out tasks.jsonl [key=value ...]

``buffer`` loads the config (its agent, gym and monitor; the model, sampling and group size come
from slime's ``/start_rollout``), then serves slime's Rollout Buffer protocol
(``cua_native.slime.buffer``) and prints ``rollout buffer on http://HOST:PORT`` when ready.
``tasks`` writes one JSONL row per task of ``cua.tasks``: ``instance_id``, ``prompt`` (the
instruction) and ``metadata`` (the task), what slime's ``--prompt-data`` (in-process route,
``--input-key prompt --metadata-key metadata``) and the buffer's ``input_file`` read.

Bad input (a flag, the config, a port taken, an unwritable ``--out``) is one line on stderr and
exit status 2, before a server starts or a gym is asked for tasks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

PROG = "python -m cua_native.slime"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> _Parser:
    parser = _Parser(
        prog=PROG, description="slime's Rollout Buffer and prompt data for the CUA loop"
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    buffer = commands.add_parser("buffer", help="serve slime's Rollout Buffer protocol")
    buffer.add_argument(
        "--config", default=None, help="cua_native config (default: the embedded one)"
    )
    buffer.add_argument("--host", default="127.0.0.1")
    buffer.add_argument("--port", type=int, default=8889, help="0: any free port")
    buffer.add_argument("overrides", nargs="*", help="config overrides, key=value")
    tasks = commands.add_parser("tasks", help="write cua.tasks as slime prompt data (JSONL)")
    tasks.add_argument(
        "--config", default=None, help="cua_native config (default: the embedded one)"
    )
    tasks.add_argument("--out", required=True, help="the JSONL file to write")
    tasks.add_argument("overrides", nargs="*", help="config overrides, key=value")
    return parser


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _load(config: str | None, overrides: list[str]) -> Any:
    from cua_native.config import load_config

    return load_config(config, overrides)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


def serve_buffer(ns: argparse.Namespace) -> int:
    from cua_native.config import ConfigError

    if not 0 <= ns.port <= 65535:
        return _fail(f"--port {ns.port}: must be in 0..65535")
    try:
        loaded = _load(ns.config, list(ns.overrides))
    except (ConfigError, OSError) as error:
        return _fail(str(error))
    try:
        sock = _listen(ns.host, ns.port)
    except OSError as error:
        return _fail(f"cannot listen on {ns.host}:{ns.port}: {error}")

    import uvicorn

    from cua_native.monitor.client.recorder import recorder_from_config
    from cua_native.slime.buffer import RolloutBuffer, build_app

    cua = loaded.cua
    recorder = None
    if cua.monitor_db_url() or cua.monitor_url:
        recorder = recorder_from_config(
            cua.monitor_db_url(), cua.monitor_url, cua.monitor_token, cua.run_dir
        )
        recorder.start_in_thread()
    shown = f"[{ns.host}]" if ":" in ns.host else ns.host
    ready = f"rollout buffer on http://{shown}:{sock.getsockname()[1]}"

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(ready, flush=True)

    try:
        app = build_app(RolloutBuffer(cua, observer=recorder))
        _Server(uvicorn.Config(app, log_level="warning", timeout_keep_alive=60)).run(sockets=[sock])
    except KeyboardInterrupt:
        pass  # Ctrl-C is how the buffer stops (uvicorn re-raises it after shutting down)
    finally:
        sock.close()
        if recorder is not None:
            recorder.close_in_thread()
    return 0


def instance_id(task: Any) -> str:
    """A task's ``instance_id``: its id, with its gym seed when it has one."""
    seed = getattr(task, "gym_seed", None)
    return task.task_id if seed is None else f"{task.task_id}@{seed}"


async def _task_rows(loaded: Any) -> list[dict[str, Any]]:
    from cua_native.rollout.dataset import load_tasks, task_row
    from cua_native.rollout.factories import make_gym

    cua = loaded.cua
    gym = make_gym(cua.agent.gym)
    try:
        tasks = await load_tasks(cua.tasks, gym)
    finally:
        await gym.aclose()
    return [
        {
            "instance_id": instance_id(t),
            "prompt": t.prompt_text,
            "metadata": task_row(t, cua.agent.gym.gym_id),
        }
        for t in tasks
    ]


def write_tasks(ns: argparse.Namespace) -> int:
    from cua_native.config import ConfigError
    from cua_native.rollout.dataset import TaskSourceError

    out = Path(ns.out)
    if out.is_dir() or not out.parent.resolve().is_dir():
        return _fail(f"--out {ns.out}: not a file in an existing directory")
    try:
        loaded = _load(ns.config, list(ns.overrides))
        rows = asyncio.run(_task_rows(loaded))
    except (ConfigError, TaskSourceError, OSError) as error:
        return _fail(str(error))
    out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    print(f"{len(rows)} tasks -> {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    if ns.command == "buffer":
        return serve_buffer(ns)
    return write_tasks(ns)


if __name__ == "__main__":
    sys.exit(main())
