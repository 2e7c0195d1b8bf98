"""Run vLLM's own request handling and sampler on the project's payloads (CPU, no GPU).

Usage (inside the ``.conformance/vllm-*`` environment): ``python vllm_probe.py JOB OUT``.

JOB holds:
- ``server_argv``: the flags AReaL's ``vLLMConfig.build_cmd`` gives ``areal_vllm_server`` for
  the project's config; parsed here by vLLM's own ``make_arg_parser`` (what that server does),
  then turned into vLLM's ``ModelConfig`` by ``AsyncEngineArgs``;
- ``chat`` / ``completion``: ``[{"name", "payload"}]`` bodies of ``/v1/chat/completions`` and
  ``/v1/completions``: validated by vLLM's ``ChatCompletionRequest``/``CompletionRequest`` and
  rendered by vLLM's GPU-less render server state (``init_render_app_state``, what
  ``vllm launch render`` serves): the token ids the engine would run and the sampling params;
- ``responses``: stand-in answers, validated by ``ChatCompletionResponse``/``CompletionResponse``;
- ``sampler``: logits, temperatures and a seed for vLLM's v1 ``Sampler`` in each logprobs mode.

OUT: what vLLM made of each (ids, unknown fields, sampling params, errors, sampled tokens with
their log-probs). One seam: the CPU platform is chosen explicitly (a CUDA build of vLLM finds
no device here and would refuse to infer one); nothing on these paths runs a kernel.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from typing import Any

import torch
import vllm
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform

platforms._current_platform = CpuPlatform()

from starlette.datastructures import State  # noqa: E402
from vllm.config import VllmConfig  # noqa: E402
from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: E402
from vllm.entrypoints.openai.api_server import init_render_app_state  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import (  # noqa: E402
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from vllm.entrypoints.openai.cli_args import make_arg_parser  # noqa: E402
from vllm.entrypoints.openai.completion.protocol import (  # noqa: E402
    CompletionRequest,
    CompletionResponse,
)
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402
from vllm.v1.sample.logits_processor import LogitsProcessors  # noqa: E402
from vllm.v1.sample.metadata import SamplingMetadata  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402


def sampling(params: Any) -> dict[str, Any]:
    return {
        k: getattr(params, k)
        for k in ("temperature", "top_p", "top_k", "max_tokens", "logprobs", "stop_token_ids")
    }


async def render(state: State, kind: str, case: dict[str, Any], model: str) -> dict[str, Any]:
    body = {**case["payload"], "model": model}
    cls = ChatCompletionRequest if kind == "chat" else CompletionRequest
    try:
        request = cls.model_validate(body)
        handler = state.openai_serving_render
        if kind == "chat":
            rendered = await handler.render_chat_request(request)
            results = [rendered]
        else:
            rendered = await handler.render_completion_request(request)
            results = rendered if isinstance(rendered, list) else [rendered]
    except Exception as exc:
        return {"name": case["name"], "error": f"{type(exc).__name__}: {exc}"}
    first = results[0]
    if not hasattr(first, "token_ids"):
        return {"name": case["name"], "error": f"vLLM refused it: {first}"}
    features = getattr(first, "features", None)
    return {
        "name": case["name"],
        "error": None,
        "unknown_fields": sorted((request.model_extra or {}).keys()),
        "token_ids": list(first.token_ids),
        "mm_items": 0
        if features is None
        else len(getattr(features, "mm_hashes", {}).get("image", [])),
        "sampling": sampling(first.sampling_params),
    }


def sample(job: dict[str, Any]) -> dict[str, Any]:
    logits = torch.tensor(job["logits"], dtype=torch.float32)
    rows = logits.shape[0]
    out: dict[str, Any] = {}
    for mode in ("raw_logprobs", "processed_logprobs"):
        out[mode] = {}
        for temperature in job["temperatures"]:
            generator = torch.Generator().manual_seed(job["seed"])
            metadata = SamplingMetadata(
                temperature=torch.full((rows,), float(temperature)),
                all_greedy=False,
                all_random=True,
                top_p=None,
                top_k=None,
                generators={i: generator for i in range(rows)},
                max_num_logprobs=0,
                no_penalties=True,
                prompt_token_ids=None,
                frequency_penalties=torch.zeros(rows),
                presence_penalties=torch.zeros(rows),
                repetition_penalties=torch.ones(rows),
                output_token_ids=[[] for _ in range(rows)],
                allowed_token_ids_mask=None,
                bad_words_token_ids={},
                logitsprocs=LogitsProcessors(),
            )
            result = Sampler(logprobs_mode=mode)(logits.clone(), metadata)
            tensors = result.logprobs_tensors
            out[mode][str(temperature)] = {
                "tokens": result.sampled_token_ids[:, 0].tolist(),
                "logprobs": tensors.logprobs[:, 0].tolist(),
                "logprob_token_ids": tensors.logprob_token_ids[:, 0].tolist(),
            }
    return out


async def main(job: dict[str, Any]) -> dict[str, Any]:
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(job["server_argv"])
    model_config = AsyncEngineArgs.from_cli_args(args).create_model_config()
    model_config.quantization = None
    state = State()
    await init_render_app_state(VllmConfig(model_config=model_config), state, args)
    model = args.served_model_name[0] if args.served_model_name else args.model
    answer: dict[str, Any] = {
        "vllm": vllm.__version__,
        "logprobs_mode": model_config.logprobs_mode,
        "chat": [await render(state, "chat", c, model) for c in job.get("chat", [])],
        "completion": [
            await render(state, "completion", c, model) for c in job.get("completion", [])
        ],
        "responses": {},
    }
    models = {"chat": ChatCompletionResponse, "completion": CompletionResponse}
    for kind, body in job.get("responses", {}).items():
        try:
            parsed = models[kind].model_validate(body)
            answer["responses"][kind] = {
                "error": None,
                "unknown": sorted((parsed.model_extra or {}).keys()),
            }
        except Exception as exc:
            answer["responses"][kind] = {"error": f"{type(exc).__name__}: {exc}"}
    if "sampler" in job:
        answer["sampler"] = sample(job["sampler"])
    return answer


if __name__ == "__main__":
    job_path, out_path = sys.argv[1], sys.argv[2]
    try:
        result = asyncio.run(main(json.loads(open(job_path).read())))
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    with open(out_path, "w") as out:
        json.dump(result, out)
