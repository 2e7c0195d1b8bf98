"""SGLang's own request handling on the project's ``/generate`` payloads.

SGLang 0.5.10.post1 (what ``areal[sglang]`` 1.0.4 pins) and the newest release, each in its own
environment: every vision turn of both families, one to three screenshots, tiny and real pixel
budget, goes through SGLang's ``GenerateReqInput`` and ``TokenizerManager`` (its multimodal
processor included) and must arrive at exactly the prompt builder's ids and image grids.
AReaL 1.0.4's stock backend, which sends the expanded ids (as this project did before), fails
there on every turn; and 0.5.10.post1 re-tokenizes a continuation after an abort, which is
why the project restarts aborted turns (``cua_native.engine.remote``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from areal.api.io_struct import ModelRequest
from areal.engine.sglang_remote import SGLangBackend

from cua_native.engine.remote import CheckedSGLangBackend

pytestmark = pytest.mark.conformance

SGLANG_ENVS = ("sglang-0.5.10.post1", "sglang-0.5.23")


def payload(backend: Any, req: ModelRequest) -> dict[str, Any]:
    body: dict[str, Any] = backend.build_generation_request(req, False, 0).payload
    return body


def non_canonical_partial(tokenizer: Any, text: str) -> list[int]:
    """Ids of ``text`` with its first multi-character token split into single characters: a
    split a sampler can produce but the tokenizer never would."""
    ids = tokenizer(text)["input_ids"]
    for i, token in enumerate(ids):
        piece = tokenizer.convert_ids_to_tokens(token)
        chars = [tokenizer.convert_tokens_to_ids(c) for c in piece]
        if len(piece) > 1 and all(isinstance(c, int) and c >= 0 for c in chars):
            return [*ids[:i], *chars, *ids[i + 1 :]]
    raise AssertionError(f"no multi-character token in {text!r}")


def cases(corpus: Any) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Probe groups (one per model directory) and what each case must come back as."""
    groups: dict[Path, list[dict[str, Any]]] = {}
    expected: dict[str, dict[str, Any]] = {}
    for turns in corpus.all():
        for index, req in enumerate(turns.requests):
            name = f"{turns.label}-{turns.budget}-{index + 1}img"
            grid = req.metadata["multi_modal_input"]["image_grid_thw"].tolist()
            wire = [
                ("ours", payload(CheckedSGLangBackend(), req)),
                ("stock", payload(SGLangBackend(), req)),
            ]
            if index == 0:
                partial = non_canonical_partial(req.tokenizer, "Open the next screen")
                continued = ModelRequest(
                    input_ids=[*req.input_ids, *partial],
                    gconfig=req.gconfig,
                    image_data=req.image_data,
                    processor=req.processor,
                    tokenizer=req.tokenizer,
                )
                wire.append(("continued", payload(CheckedSGLangBackend(), continued)))
            for kind, body in wire:
                key = f"{name}-{kind}"
                groups.setdefault(turns.model_dir, []).append({"name": key, "payload": body})
                ids = req.input_ids if kind != "continued" else [*req.input_ids, *partial]
                expected[key] = {"input_ids": ids, "image_grid_thw": grid}
    job = [{"model_dir": str(d), "cases": c} for d, c in groups.items()]
    # SGLang's legacy loader (``skip_tokenizer_init``): the same payloads, the same ids
    for turns in corpus.all():
        if turns.budget != "tiny":
            continue
        legacy = []
        for index, req in enumerate(turns.requests):
            key = f"{turns.label}-{turns.budget}-{index + 1}img-legacy"
            legacy.append({"name": key, "payload": payload(CheckedSGLangBackend(), req)})
            grid = req.metadata["multi_modal_input"]["image_grid_thw"].tolist()
            expected[key] = {"input_ids": req.input_ids, "image_grid_thw": grid}
        job.append(
            {
                "model_dir": str(turns.model_dir),
                "server_args": {"skip_tokenizer_init": True},
                "cases": legacy,
            }
        )
    return job, expected


@pytest.fixture(scope="module", params=SGLANG_ENVS)
def answers(
    request: pytest.FixtureRequest, corpus: Any, conformance: Any, tmp_path_factory: Any
) -> tuple[str, dict[str, Any], dict[str, dict[str, Any]]]:
    env: str = request.param
    job, expected = cases(corpus)
    out = conformance.run_probe(
        env, "sglang_probe.py", {"groups": job}, tmp_path_factory.mktemp(env)
    )
    assert out["sglang"] == env.removeprefix("sglang-")
    return env, {r["name"]: r for r in out["results"]}, expected


def test_every_vision_turn_arrives_as_our_exact_ids(answers: Any) -> None:
    env, got, expected = answers
    ours = [k for k in expected if k.endswith("-ours")]
    assert len(ours) == 18  # (4 shipped configs + 2 tiny families) x 3 turns (1-3 images)
    legacy = [k for k in expected if k.endswith("-legacy")]
    assert len(legacy) == 6  # the tiny budget again, with sglang.skip_tokenizer_init
    for key in ours + legacy:
        assert got[key]["error"] is None, f"{env} {key}: {got[key]['error']}"
        assert got[key]["input_ids"] == expected[key]["input_ids"], f"{env} {key}"
        assert got[key]["image_grid_thw"] == expected[key]["image_grid_thw"], f"{env} {key}"


def test_the_expanded_ids_areal_sends_fail_on_the_server(answers: Any) -> None:
    """What this project sent before (AReaL 1.0.4's stock ``SGLangBackend`` payload): the
    server expands the pads a second time and the request fails, on every turn (0.5.10.post1:
    transformers' ``IndexError``; 0.5.23 fails it in its own processor)."""
    env, got, expected = answers
    stock = [k for k in expected if k.endswith("-stock")]
    assert len(stock) == 18
    for key in stock:
        assert got[key]["input_ids"] is None, f"{env} {key} was accepted"
        assert got[key]["error"], f"{env} {key}"
        if env == "sglang-0.5.10.post1":
            assert "IndexError" in got[key]["error"], f"{env} {key}: {got[key]['error']}"


def test_a_continuation_is_re_tokenized_by_the_pinned_release(answers: Any) -> None:
    """``prompt + partial`` (AReaL's resubmission after an abort) with a partial that is not the
    tokenizer's own split: SGLang 0.5.10.post1 decodes and re-tokenizes it into other ids, so
    continuing would train on ids the server never ran, and the project restarts such a turn;
    0.5.23 keeps the ids sent (a restart is exact on both)."""
    env, got, expected = answers
    continued = [k for k in expected if k.endswith("-continued")]
    assert len(continued) == 6
    for key in continued:
        assert got[key]["error"] is None, f"{env} {key}: {got[key]['error']}"
        if env == "sglang-0.5.10.post1":
            assert got[key]["input_ids"] != expected[key]["input_ids"], f"{env} {key}"
            assert len(got[key]["input_ids"]) < len(expected[key]["input_ids"])
        else:
            assert got[key]["input_ids"] == expected[key]["input_ids"], f"{env} {key}"
