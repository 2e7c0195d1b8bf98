"""``python -m cua_native.engine.serve``: run the stand-in server (see the package docstring).

Flags are checked before the model loads; a bad one prints one line and exits 2. When the
server listens it prints exactly one line, ``serving BACKEND on http://HOST:PORT`` (with the
real port when ``--port 0`` asked for a free one), which launchers wait for.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from cua_native.engine.serve import Backend

DTYPES = ("float32", "bfloat16", "float16")
SERVER_NCCL_ENV = {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}
"""NCCL settings SGLang's and vLLM's servers start with unless already set (SGLang's
``_set_envs_and_config``; AReaL sets the same on its actor for xccl weight updates). Peers of
one NCCL group must agree: a server with NCCL's default cuMem buffers fails the trainer's
broadcast with ``Cuda failure 'invalid argument'``."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


@dataclass(frozen=True, slots=True)
class ServeArgs:
    model: Path
    backend: Backend
    host: str
    port: int
    device: str
    dtype: str
    seed: int
    max_batch_size: int
    served_model_name: str
    log_level: str


def parse_args(argv: Sequence[str] | None = None) -> ServeArgs:
    """Parse and check every flag (no model loading). Exits 2 with one line on a bad flag."""
    from cua_native.engine.serve import BACKENDS

    parser = _Parser(prog="python -m cua_native.engine.serve", description=__doc__)
    parser.add_argument("--model", required=True, help="a local Hugging Face model directory")
    parser.add_argument("--backend", required=True, choices=BACKENDS)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000, help="0: any free port")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--seed", type=int, default=0, help="engine sampling seed")
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--served-model-name", default=None, help="default: the model path")
    parser.add_argument(
        "--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug")
    )
    ns = parser.parse_args(argv)
    model = Path(ns.model)
    if not (model / "config.json").is_file():
        parser.error(f"--model {ns.model}: not a model directory (no config.json)")
    if not 0 <= ns.port <= 65535:
        parser.error(f"--port {ns.port}: must be in 0..65535")
    if ns.max_batch_size < 1:
        parser.error(f"--max-batch-size {ns.max_batch_size}: must be >= 1")
    device = ns.device
    if device != "cpu" and not (device == "cuda" or device.startswith("cuda:")):
        parser.error(f"--device {device}: must be cpu, cuda or cuda:N")
    if device != "cpu":
        import torch

        index = int(device.split(":", 1)[1]) if ":" in device else 0
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            parser.error(f"--device {device}: no such CUDA device on this machine")
    return ServeArgs(
        model=model,
        backend=ns.backend,
        host=ns.host,
        port=ns.port,
        device=device,
        dtype=ns.dtype,
        seed=ns.seed,
        max_batch_size=ns.max_batch_size,
        served_model_name=ns.served_model_name or str(ns.model),
        log_level=ns.log_level,
    )


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        sock = _listen(args.host, args.port)
    except OSError as exc:
        print(f"serve: error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2

    for key, value in SERVER_NCCL_ENV.items():  # before any NCCL communicator exists
        os.environ.setdefault(key, value)
    import torch
    import uvicorn

    from cua_native.engine.inprocess import InProcessEngine
    from cua_native.engine.serve import ServedModel, build_app

    engine = InProcessEngine.from_pretrained(
        args.model,
        device=args.device,
        dtype=getattr(torch, args.dtype),
        seed=args.seed,
        max_batch_size=args.max_batch_size,
    )
    port = sock.getsockname()[1]
    shown = f"[{args.host}]" if ":" in args.host else args.host
    ready_line = f"serving {args.backend} on http://{shown}:{port}"

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(ready_line, flush=True)

    try:
        app = build_app(ServedModel(engine, args.served_model_name), args.backend)
        config = uvicorn.Config(app, log_level=args.log_level, timeout_keep_alive=60)
        _Server(config).run(sockets=[sock])
    finally:
        engine.destroy()
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
