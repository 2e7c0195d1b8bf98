"""vLLM 0.19.1's own code (what ``areal[vllm]`` 1.0.4 pins) on the project's requests.

- The server command AReaL builds from the shipped vLLM config parses with vLLM's own parser
  and sets ``logprobs_mode=processed_logprobs``.
- Every chat (vision) payload of both families, one to three screenshots, tiny and real pixel
  budget, validates as vLLM's ``ChatCompletionRequest`` with no unknown field, and vLLM's own
  renderer builds exactly the prompt builder's ids; the text path likewise.
- The stand-in's answers validate against vLLM's response models.
- vLLM's own v1 ``Sampler``: in ``processed_logprobs`` mode the sampled tokens' log-probs are
  ``log_softmax(logits / T)`` (the project's definition, ``engine.sampling``) at every
  temperature; in the default ``raw_logprobs`` mode they are not, once ``T != 1``.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters, vLLMConfig
from areal.api.io_struct import ModelRequest
from areal.engine.vllm_remote import VLLMBackend

from cua_native.config import load_config
from cua_native.engine.inprocess import InProcessEngine, InProcessEngineConfig
from cua_native.engine.remote import CheckedVLLMBackend
from cua_native.engine.sampling import tempered_logprobs
from cua_native.engine.serve import ServedModel, build_app

pytestmark = pytest.mark.conformance

ROOT = Path(__file__).resolve().parents[2]
VLLM_ENV = "vllm-0.19.1"
TEMPERATURES = (1.0, 0.7, 1.3)


def server_argv(model_dir: Path) -> list[str]:
    """The flags AReaL 1.0.4 starts ``areal_vllm_server`` with for the shipped vLLM config."""
    loaded = load_config(
        ROOT / "configs" / "qwen3_vl_android_vllm.yaml", [f"actor.path={model_dir}"]
    )
    cmd = vLLMConfig.build_cmd(loaded.areal.vllm, tp_size=1, pp_size=1)
    assert cmd[:3] == ["python3", "-m", "areal.engine.vllm_ext.areal_vllm_server"]
    return list(cmd[3:])


def chat_payload(req: ModelRequest) -> dict[str, Any]:
    """What the project's backend posts (a private copy: AReaL rewrites messages in place)."""
    private = dataclasses.replace(req, vision_msg_vllm=copy.deepcopy(req.vision_msg_vllm))
    http = CheckedVLLMBackend().build_generation_request(private, False, 0)
    assert http.endpoint == "/v1/chat/completions"
    body: dict[str, Any] = http.payload
    return body


def text_request(req: ModelRequest) -> ModelRequest:
    ids = req.tokenizer("<|im_start|>user\nGo home.<|im_end|>\n<|im_start|>assistant\n")
    return ModelRequest(
        input_ids=list(ids["input_ids"]),
        gconfig=GenerationHyperparameters(max_new_tokens=8, temperature=0.7),
        tokenizer=req.tokenizer,
    )


async def stand_in_answers(model_dir: Path, chat: dict[str, Any], text: dict[str, Any]) -> Any:
    """The stand-in's answers to one chat and one completion request."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    processor = AutoProcessor.from_pretrained(model_dir)
    engine = InProcessEngine(model, processor, config=InProcessEngineConfig())
    engine.initialize()
    try:
        app = build_app(ServedModel(engine, str(model_dir)), "vllm")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://stand-in") as http:
            small = {**chat, "max_tokens": 4}
            chat_answer = (await http.post("/v1/chat/completions", json=small)).json()
            text_answer = (await http.post("/v1/completions", json=text)).json()
    finally:
        engine.destroy()
    return {"chat": chat_answer, "completion": text_answer}


@pytest.fixture(scope="module")
def vllm_run(corpus: Any, conformance: Any, tmp_path_factory: Any) -> Any:
    tiny_dir = corpus.episodes["qwen3_vl", "tiny"].model_dir
    expected: dict[str, list[int]] = {}
    groups: dict[Path, list[dict[str, Any]]] = {}
    for turns in corpus.all():
        for index, req in enumerate(turns.requests):
            name = f"{turns.label}-{turns.budget}-{index + 1}img"
            groups.setdefault(turns.model_dir, []).append(
                {"name": name, "payload": chat_payload(req)}
            )
            expected[name] = list(req.input_ids)
    first = corpus.episodes["qwen3_vl", "tiny"].requests[0]
    text = text_request(first)
    text_http = VLLMBackend().build_generation_request(text, False, 0)
    assert text_http.endpoint == "/v1/completions"
    expected["text"] = list(text.input_ids)
    responses = asyncio.run(stand_in_answers(tiny_dir, chat_payload(first), text_http.payload))
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(7)) * 3
    answers = {}
    for model_dir, cases in groups.items():
        job: dict[str, Any] = {"server_argv": server_argv(model_dir), "chat": cases}
        if model_dir == tiny_dir:
            job["completion"] = [{"name": "text", "payload": text_http.payload}]
            job["responses"] = responses
            job["sampler"] = {"logits": logits.tolist(), "temperatures": TEMPERATURES, "seed": 3}
        answers[model_dir] = conformance.run_probe(
            VLLM_ENV, "vllm_probe.py", job, tmp_path_factory.mktemp(model_dir.name)
        )
    return answers, expected, logits, answers[tiny_dir]


def test_areal_server_command_parses_and_sets_processed_logprobs(vllm_run: Any) -> None:
    answers, _, _, _ = vllm_run
    for answer in answers.values():
        assert answer["vllm"] == "0.19.1"
        assert answer["logprobs_mode"] == "processed_logprobs"


def test_every_vision_turn_renders_as_our_exact_ids(vllm_run: Any) -> None:
    answers, expected, _, tiny = vllm_run
    rendered = [r for a in answers.values() for r in a["chat"]]
    assert len(rendered) == 18  # (4 shipped configs + 2 tiny families) x 3 turns
    for result in rendered:
        name = result["name"]
        assert result["error"] is None, f"{name}: {result['error']}"
        assert result["unknown_fields"] == [], name
        assert result["token_ids"] == expected[name], name
        assert result["mm_items"] == int(name.split("-")[-1][0]), name
        assert result["sampling"]["logprobs"] == 0, name  # the sampled token's log-prob
    (text,) = tiny["completion"]
    assert text["error"] is None and text["unknown_fields"] == []
    assert text["token_ids"] == expected["text"]
    assert text["sampling"]["temperature"] == pytest.approx(0.7)


def test_stand_in_answers_validate_against_vllm_response_models(vllm_run: Any) -> None:
    _, _, _, tiny = vllm_run
    for kind in ("chat", "completion"):
        assert tiny["responses"][kind]["error"] is None, tiny["responses"][kind]


def test_processed_logprobs_are_the_sampling_distributions(vllm_run: Any) -> None:
    _, _, logits, tiny = vllm_run
    sampled = tiny["sampler"]
    for temperature in TEMPERATURES:
        ours = tempered_logprobs(logits, temperature)
        for mode in ("processed_logprobs", "raw_logprobs"):
            got = sampled[mode][str(temperature)]
            assert got["logprob_token_ids"] == got["tokens"]
            want = ours.gather(1, torch.tensor(got["tokens"])[:, None])[:, 0]
            close = torch.allclose(torch.tensor(got["logprobs"]), want, atol=1e-5)
            if mode == "processed_logprobs" or temperature == 1.0:
                assert close, (mode, temperature, got["logprobs"], want.tolist())
            else:  # vLLM's default: the raw logits' log-probs, wrong for PPO at T != 1
                assert not close, (mode, temperature)
