"""Run SGLang's own ``/generate`` request handling on the project's payloads (CPU, no server).

Usage (inside a ``.conformance/sglang-*`` environment): ``python sglang_probe.py JOB OUT``.
JOB: ``{"groups": [{"model_dir": ..., "server_args": {...}, "cases": [{"name": ..., "payload":
{...}}]}]}`` (``server_args``: extra ``ServerArgs`` fields, e.g. ``skip_tokenizer_init``).
For each payload this does what SGLang's HTTP server does with a ``POST /generate`` body, up
to the hand-over to the scheduler: ``GenerateReqInput(**payload)`` (the FastAPI body model),
then ``TokenizerManager.generate_request``, which normalizes the request, runs the model's
multimodal processor (``QwenVLImageProcessor`` picked by SGLang's own registry from the
model's architecture) and builds the ``TokenizedGenerateReqInput`` the scheduler would run.
The scheduler hand-over (``_send_one_request``) is where the probe stops and reads that object.
OUT: ``{"sglang": version, "results": [{"name", "input_ids", "image_grid_thw", "error"}]}``.

Two seams, both for a machine without a GPU: ``sgl_kernel`` is an import stub (its CUDA
kernels are never called on this path), and the image processor runs on the CPU (SGLang's own
``_is_cpu`` switch, what ``SGLANG_USE_CPU_ENGINE=1`` sets on a CPU host; on a GPU host the same
fast processor runs on the GPU and yields the same ids).
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from typing import Any

import sgl_kernel_stub

sgl_kernel_stub.install()

import sglang  # noqa: E402
import sglang.srt.multimodal.processors.base_processor as base_processor  # noqa: E402
import sglang.srt.server_args as server_args_module  # noqa: E402
from sglang.srt.managers.io_struct import GenerateReqInput  # noqa: E402
from sglang.srt.managers.tokenizer_manager import TokenizerManager  # noqa: E402
from sglang.srt.server_args import PortArgs, ServerArgs  # noqa: E402

base_processor._is_cpu = True


class HandedToScheduler(Exception):
    """Raised at the scheduler hand-over, carrying the tokenized request."""


def publish(args: ServerArgs) -> None:
    """Make ``args`` the tokenizer process's global server args, as SGLang's launcher does."""
    try:
        from sglang.srt.runtime_context import publish as runtime_publish
    except ImportError:
        server_args_module.set_global_server_args_for_scheduler(args)
    else:
        runtime_publish(args, role="tokenizer")


def tokenizer_manager(model_dir: str, extra: dict[str, Any]) -> TokenizerManager:
    args = ServerArgs(model_path=model_dir, device="cpu", enable_multimodal=True, **extra)
    publish(args)
    manager = TokenizerManager(args, PortArgs.init_new(args))

    def hand_over(tokenized: Any) -> None:
        raise HandedToScheduler(tokenized)

    manager._send_one_request = hand_over
    return manager


async def tokenize(manager: TokenizerManager, payload: dict[str, Any]) -> dict[str, Any]:
    try:
        obj = GenerateReqInput(**payload)
        async for _ in manager.generate_request(obj):
            pass
    except HandedToScheduler as handed:
        tokenized = handed.args[0]
    except Exception as exc:  # what SGLang's handler would answer with: kept, not raised
        return {"input_ids": None, "image_grid_thw": None, "error": f"{type(exc).__name__}: {exc}"}
    else:
        return {"input_ids": None, "image_grid_thw": None, "error": "never reached the scheduler"}
    grids = []
    mm_inputs = getattr(tokenized, "mm_inputs", None)
    for item in getattr(mm_inputs, "mm_items", None) or []:
        grid = (getattr(item, "model_specific_data", None) or {}).get("image_grid_thw")
        if grid is not None:
            grids.extend(grid.reshape(-1, 3).tolist())
    return {
        "input_ids": [int(t) for t in tokenized.input_ids],
        "image_grid_thw": grids,
        "error": None,
    }


async def main(job: dict[str, Any]) -> dict[str, Any]:
    results = []
    for group in job["groups"]:
        manager = tokenizer_manager(group["model_dir"], group.get("server_args") or {})
        for case in group["cases"]:
            answer = await tokenize(manager, case["payload"])
            results.append({"name": case["name"], **answer})
    return {"sglang": sglang.__version__, "results": results}


if __name__ == "__main__":
    job_path, out_path = sys.argv[1], sys.argv[2]
    try:
        answer = asyncio.run(main(json.loads(open(job_path).read())))
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    with open(out_path, "w") as out:
        json.dump(answer, out)
