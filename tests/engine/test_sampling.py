"""``sample_rows`` (batched) gives exactly ``sample_token``'s result for every row."""

from __future__ import annotations

import torch

from cua_native.engine.sampling import SamplingParams, sample_rows, sample_token


def _params(greedy: bool, temperature: float, top_k: int = 0, top_p: float = 1.0) -> SamplingParams:
    return SamplingParams(
        greedy=greedy,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        max_new_tokens=8,
        min_new_tokens=3,
        stop_token_ids=frozenset({5, 7}),
        never_sample=frozenset({1}),
    )


def test_sample_rows_equals_sample_token_per_row() -> None:
    gen = torch.Generator().manual_seed(0)
    params = [
        _params(False, 1.0),
        _params(False, 0.7),
        _params(True, 0.0),
        _params(False, 1.3, top_k=20),
        _params(False, 0.9, top_p=0.8),
        _params(True, 1.0, top_k=4),
    ]
    for trial in range(40):
        logits = torch.randn((len(params), 300), generator=gen) * (1 + trial % 5)
        if trial % 7 == 0:  # a peaked row, and one whose tail bins carry no mass
            logits[0, 11] = 80.0
            logits[1, -40:] = -1e4
        generated = [trial % 5] * len(params)
        uniforms = [float(torch.rand((), generator=gen, dtype=torch.float64)) for _ in params]
        if trial == 0:
            uniforms[1] = 0.999999999
        batched = sample_rows(logits, params, generated, uniforms)
        for i, p in enumerate(params):
            assert batched[i] == sample_token(logits[i], p, generated[i], uniforms[i])
            # a row's result does not depend on the other rows sharing the batch
            alone = sample_rows(logits[i : i + 1], [p], [generated[i]], [uniforms[i]])
            assert alone[0] == batched[i]
        for i, picked in enumerate(batched):
            assert picked.token != 1
            if generated[i] < 3:
                assert picked.token not in (5, 7)
