"""``RouterEngine`` sends slime's SGLang router exactly what the AReaL cluster path sends SGLang.

The same turn (built by the project's prompt pipeline: exact ids, two screenshots, base64
PNGs) goes once through AReaL 1.0.4's own ``RemoteSGLangEngine`` with the project's checked
backend installed (the cluster path) and once through ``RouterEngine`` (the slime path), to the
stand-in SGLang server: the request bodies are identical (one pad per image, ``image_data``,
sampling, ``return_logprob``), so what ``tests/conformance`` proves of that body against
SGLang's own code holds for both; greedy answers are identical too, and the server's weight
version labels the tokens.
"""

from __future__ import annotations

import json
from typing import Any

from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
from areal.engine.sglang_remote import RemoteSGLangEngine
from PIL import Image
from starlette.requests import Request

from cua_native.engine.remote import prepare_remote_engine
from cua_native.engine.serve import build_app
from cua_native.engine.sglang_vision import collapse_image_pads
from cua_native.prompts.images import prepare_image, sizing_from_processor
from cua_native.prompts.request import model_request, run_processor
from cua_native.slime.engine import RouterEngine


def turn(processor: Any) -> Any:
    """A two-screenshot turn as the workflow sends any engine (no processor tensors on it)."""
    sizing = sizing_from_processor(processor)
    images = [
        prepare_image(Image.new("RGB", (1080, 2400), color), sizing, encode=True)
        for color in ((20, 120, 200), (200, 40, 10))
    ]
    messages = [
        {"role": "system", "content": "You are a phone agent."},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": images[0].message_url}},
                {"type": "text", "text": "Before."},
                {"type": "image_url", "image_url": {"url": images[1].message_url}},
                {"type": "text", "text": "Open Settings"},
            ],
        },
    ]
    gconfig = GenerationHyperparameters(n_samples=1, max_new_tokens=12, greedy=True)
    req = model_request(
        run_processor(processor, messages, images), messages, images, processor, gconfig
    )
    req.metadata = {}
    return req


async def test_router_engine_sends_the_cluster_paths_request(tiny_dir: Any, serve_app: Any) -> None:
    import torch

    from cua_native.engine import InProcessEngine
    from cua_native.engine.serve import ServedModel

    engine = InProcessEngine.from_pretrained(tiny_dir, device="cpu", dtype=torch.float32, seed=0)
    engine.set_version(3)
    seen: list[dict[str, Any]] = []
    app = build_app(ServedModel(engine, str(tiny_dir)), "sglang")

    @app.middleware("http")
    async def record(request: Request, call_next: Any) -> Any:
        if request.url.path == "/generate":
            seen.append(json.loads(await request.body()))
        return await call_next(request)

    with serve_app(app) as (host, port):
        req = turn(engine.processor)
        cluster = RemoteSGLangEngine(
            InferenceEngineConfig(
                backend="sglang:d1",
                experiment_name="slime-test",
                trial_name="t",
                setup_timeout=60.0,
                request_timeout=60.0,
                request_retries=1,
            )
        )
        cluster.initialize(addr=f"{host}:{port}")
        assert prepare_remote_engine(cluster)
        try:
            areal_answer = await cluster.agenerate(req)
        finally:
            cluster.destroy()
        slime_engine = RouterEngine(f"http://{host}:{port}", timeout_s=60.0)
        try:
            slime_answer = await slime_engine.agenerate(req)
        finally:
            await slime_engine.aclose()
    engine.destroy()

    assert len(seen) == 2
    assert seen[0] == seen[1]
    pad = engine.processor.image_token_id
    assert seen[1]["input_ids"] == collapse_image_pads(req.input_ids, pad)
    assert seen[1]["input_ids"].count(pad) == len(seen[1]["image_data"]) == 2
    assert slime_answer.output_tokens == areal_answer.output_tokens
    assert slime_answer.output_logprobs == areal_answer.output_logprobs
    assert slime_answer.input_tokens == req.input_ids
    assert slime_answer.output_versions == [3] * len(slime_answer.output_tokens)
    assert slime_engine.get_version() == 3
