"""Pure sampling and log-probability functions for one row of logits.

Log-probability definition (the project's core invariant, what AReaL's trainer recomputes):

* ``logprob`` of a sampled token is ``log_softmax(logits / T)[token]`` over the **whole**
  vocabulary, in float32, where ``T`` is ``temperature`` (``T = 1`` when ``temperature == 0``).
* ``top_k``, ``top_p``, ``min_new_tokens`` and the vision placeholder ids only restrict *which* tokens can be sampled;
  they do not change the reported logprob.
* ``truncated_logprob`` is the log-probability under the distribution actually sampled from
  (tempered, stop tokens banned before ``min_new_tokens``, top-k/top-p applied, renormalised).

Randomness: one uniform ``u`` in [0, 1) per step, drawn by the caller from a per-request
generator, picks the token by inverse CDF. This keeps a request's tokens independent of
batch composition and of the device.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
from areal.api.cli_args import GenerationHyperparameters

LOGPROB_MODES = ("full", "truncated")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Validated sampling settings of one request."""

    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    max_new_tokens: int
    min_new_tokens: int
    stop_token_ids: frozenset[int]
    stop_strings: tuple[str, ...] = ()
    never_sample: frozenset[int] = frozenset()
    """Ids that are never sampled: the vision placeholders, which a prompt may hold only
    together with matching pixels (a trained model gives them ~0 probability anyway)."""

    @property
    def logprob_temperature(self) -> float:
        return self.temperature if self.temperature > 0 else 1.0

    @property
    def restricts(self) -> bool:
        """Whether top-k or top-p can remove tokens from the sampled distribution."""
        return self.top_k > 0 or self.top_p < 1.0

    @classmethod
    def from_gconfig(
        cls,
        gconfig: GenerationHyperparameters,
        prompt_len: int,
        eos_token_ids: Collection[int],
        vocab_size: int,
        never_sample: Collection[int] = (),
    ) -> SamplingParams:
        """Check ``gconfig`` for what an in-process engine supports and clamp the budget.

        ``max_new_tokens`` is ``min(gconfig.max_new_tokens, gconfig.max_tokens - prompt_len)``,
        as AReaL's remote engines do. Raises ``ValueError`` with the reason otherwise.
        """
        if gconfig.n_samples != 1:
            raise ValueError(
                f"n_samples={gconfig.n_samples}: the in-process engine generates one sample per "
                "request; call agenerate n_samples times (AReaL's remote engines require the same)."
            )
        if gconfig.use_beam_search:
            raise ValueError("use_beam_search is not supported by the in-process engine.")
        if gconfig.frequency_penalty != 0.0:
            raise ValueError(
                f"frequency_penalty={gconfig.frequency_penalty} is not supported: it would change "
                "the sampling distribution away from log_softmax(logits / T)."
            )
        if gconfig.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {gconfig.temperature}")
        if not 0.0 < gconfig.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {gconfig.top_p}")
        if gconfig.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be >= 0, got {gconfig.min_new_tokens}")
        if prompt_len <= 0:
            raise ValueError("input_ids is empty: the engine needs at least one prompt token.")
        max_new = min(gconfig.max_new_tokens, gconfig.max_tokens - prompt_len)
        if max_new <= 0:
            raise ValueError(
                f"no room to generate: max_new_tokens={gconfig.max_new_tokens}, "
                f"max_tokens={gconfig.max_tokens}, prompt_len={prompt_len}."
            )
        stops = set(gconfig.stop_token_ids)
        if not gconfig.ignore_eos:
            stops.update(eos_token_ids)
        top_k = gconfig.top_k if 0 < gconfig.top_k < vocab_size else 0
        return cls(
            greedy=gconfig.greedy or gconfig.temperature == 0,
            temperature=float(gconfig.temperature),
            top_k=top_k,
            top_p=float(gconfig.top_p),
            max_new_tokens=max_new,
            min_new_tokens=min(gconfig.min_new_tokens, max_new),
            stop_token_ids=frozenset(int(t) for t in stops),
            stop_strings=tuple(gconfig.stop or ()),
            never_sample=frozenset(int(t) for t in never_sample),
        )


@dataclass(frozen=True, slots=True)
class SampledToken:
    token: int
    logprob: float
    """``log_softmax(logits / T)[token]`` over the whole vocabulary."""
    truncated_logprob: float
    """Log-probability under the renormalised distribution actually sampled from."""


def tempered_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log_softmax(logits / T)`` in float32 (``T = 1`` when ``temperature`` is 0)."""
    t = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits.float() / t, dim=-1)


def allowed_mask(
    logprobs: torch.Tensor, top_k: int, top_p: float, banned: Collection[int]
) -> torch.Tensor:
    """Tokens that may be sampled: ``banned`` removed first, then top-k, then top-p.

    Top-p keeps the smallest prefix of tokens (by descending probability, after the ban and
    top-k, renormalised) whose exclusive cumulative probability is below ``top_p``; the most
    likely token is always kept.
    """
    work = logprobs.clone()
    if banned:
        work[torch.tensor(sorted(banned), dtype=torch.long, device=work.device)] = float("-inf")
    if not torch.isfinite(work).any():
        raise ValueError("every token is banned: cannot sample (check stop_token_ids).")
    vocab = work.shape[-1]
    if top_k <= 0 and top_p >= 1.0:
        return torch.isfinite(work)
    k = top_k if 0 < top_k < vocab else vocab
    values, order = torch.topk(work, k)
    keep = torch.isfinite(values)
    if top_p < 1.0:
        probs = torch.softmax(values, dim=-1)
        exclusive = torch.cumsum(probs, dim=-1) - probs
        keep &= exclusive < top_p
        keep[0] = True
    mask = torch.zeros(vocab, dtype=torch.bool, device=work.device)
    mask[order[keep]] = True
    return mask


def sample_token(
    logits: torch.Tensor,
    params: SamplingParams,
    n_generated: int,
    uniform: float,
) -> SampledToken:
    """Pick the next token from one row of logits ``[vocab]``.

    ``n_generated`` is how many tokens this request already produced (for ``min_new_tokens``);
    ``uniform`` in [0, 1) is the step's random draw (ignored when greedy).
    """
    logprobs = tempered_logprobs(logits, params.temperature)
    banned = set(params.never_sample)
    if n_generated < params.min_new_tokens:
        banned |= params.stop_token_ids
    mask = allowed_mask(
        logprobs,
        0 if params.greedy else params.top_k,
        1.0 if params.greedy else params.top_p,
        banned,
    )
    restricted = logprobs.masked_fill(~mask, float("-inf"))
    if params.greedy:
        token = int(torch.argmax(restricted).item())
    else:
        probs = torch.softmax(restricted.double(), dim=-1)
        cdf = torch.cumsum(probs, dim=-1)
        target = torch.tensor([uniform * float(cdf[-1])], dtype=cdf.dtype, device=cdf.device)
        token = int(torch.searchsorted(cdf, target, right=True).clamp_max(cdf.numel() - 1).item())
        while not bool(mask[token]):  # a zero-probability bin at the very end; step back
            token -= 1
    truncated = torch.log_softmax(restricted, dim=-1)[token]
    return SampledToken(
        token=token, logprob=float(logprobs[token]), truncated_logprob=float(truncated)
    )


def sample_rows(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generated: Sequence[int],
    uniforms: Sequence[float],
) -> list[SampledToken]:
    """``sample_token`` for every row of ``logits`` ``[rows, vocab]``, batched.

    Rows without top-k/top-p (greedy or plain sampling) share a few whole-batch kernels and
    one transfer to the host; the others go through ``sample_token``. Each row's arithmetic
    is ``sample_token``'s (same operations, per row), so the result does not depend on which
    rows share the batch (``tests/engine/test_sampling.py`` checks equality).
    """
    out: list[SampledToken | None] = [None] * len(params)
    simple = [i for i, p in enumerate(params) if batchable(p)]
    for i in range(len(params)):
        if i not in simple:
            out[i] = sample_token(logits[i], params[i], generated[i], uniforms[i])
    if simple:
        picked = _launch_simple(logits, params, generated, uniforms, simple).read()
        for i, token in zip(simple, picked, strict=True):
            out[i] = token
    return [s for s in out if s is not None]


def batchable(params: SamplingParams) -> bool:
    """Whether a row samples on the device with no host decision (no top-k/top-p)."""
    return params.greedy or not params.restricts


@dataclass(frozen=True, slots=True)
class LaunchedSample:
    """Tokens sampled on the device whose values the host has not read yet.

    ``tokens`` (``[rows]``, long, on the logits' device) can feed the next decode step
    before the host sees them; ``read`` waits for the one copy to the host and returns what
    ``sample_rows`` would have returned for these rows.
    """

    tokens: torch.Tensor
    values: torch.Tensor
    """``[rows, 4]`` float64 on the host (pinned on CUDA, filled by an asynchronous copy):
    full log-prob, truncated log-prob, token, whether any token was allowed."""
    ready: torch.cuda.Event | None
    """Recorded after the copy (``None``: the copy was synchronous)."""

    def read(self) -> list[SampledToken]:
        if self.ready is not None:
            self.ready.synchronize()
        values = self.values.tolist()
        if not all(row[3] for row in values):
            raise ValueError("every token is banned: cannot sample (check stop_token_ids).")
        return [
            SampledToken(token=int(token), logprob=float(lp), truncated_logprob=float(tlp))
            for lp, tlp, token, _ in values
        ]


def launch_sample_rows(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generated: Sequence[int],
    uniforms: Sequence[float],
) -> LaunchedSample:
    """``sample_rows`` for rows that are all ``batchable``, without waiting for the device:
    the same kernels, the result read later (``LaunchedSample.read``)."""
    if not all(batchable(p) for p in params):
        raise ValueError("launch_sample_rows needs rows without top-k/top-p")
    return _launch_simple(logits, params, generated, uniforms, list(range(len(params))))


def _launch_simple(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generated: Sequence[int],
    uniforms: Sequence[float],
    rows: list[int],
) -> LaunchedSample:
    """Whole-batch kernels for ``rows``; nothing waits for the device.

    The per-row inputs (temperatures, draws, banned ids) travel to the device in one
    float64 tensor (every value is exact there: float64 draws, temperatures rounded to
    float32 as ``tensor(..., dtype=float32)`` does, integer ids below 2**53).
    """
    device = logits.device
    sampling = [j for j, i in enumerate(rows) if not params[i].greedy]
    ban_rows: list[int] = []
    ban_ids: list[int] = []
    for j, i in enumerate(rows):
        banned = set(params[i].never_sample)
        if generated[i] < params[i].min_new_tokens:
            banned |= params[i].stop_token_ids
        ban_rows += [j] * len(banned)
        ban_ids += sorted(banned)
    n, s, b = len(rows), len(sampling), len(ban_ids)
    whole = rows == list(range(logits.shape[0]))
    host = torch.tensor(
        [params[i].logprob_temperature for i in rows]
        + [uniforms[rows[j]] for j in sampling]
        + [float(j) for j in sampling]
        + [float(r) for r in ban_rows]
        + [float(t) for t in ban_ids]
        + ([] if whole else [float(i) for i in rows]),
        dtype=torch.float64,
    )
    packed = host.pin_memory().to(device, non_blocking=True) if logits.is_cuda else host.to(device)
    temps = packed[:n].to(torch.float32)
    u = packed[n : n + s]
    pick = packed[n + s : n + 2 * s].long()
    bans = packed[n + 2 * s : n + 2 * s + 2 * b].long()
    chosen = logits if whole else logits.index_select(0, packed[n + 2 * s + 2 * b :].long())
    logprobs = torch.log_softmax(chosen.float() / temps[:, None], dim=-1)
    restricted = logprobs
    if b:
        # index_fill_ takes the value as a scalar argument (indexing with a Python
        # float would copy it from the host first)
        flat = bans[:b] * logprobs.shape[-1] + bans[b:]
        restricted = logprobs.clone().view(-1).index_fill_(0, flat, float("-inf"))
        restricted = restricted.view(logprobs.shape)
    mask = torch.isfinite(restricted)
    some_allowed = mask.any(dim=-1)
    tokens = torch.argmax(restricted, dim=-1)
    if s:
        probs = torch.softmax(restricted.index_select(0, pick).double(), dim=-1)
        # one 1-D scan per row, as in sample_token: the same summation order (on CUDA a
        # batched scan differs in the last bits, and is slower for a few long rows)
        cdf = torch.empty_like(probs)
        for j in range(s):
            torch.cumsum(probs[j], dim=-1, out=cdf[j])
        target = u[:, None] * cdf[:, -1:]
        drawn = torch.searchsorted(cdf, target, right=True).clamp_max(cdf.shape[-1] - 1)
        # a zero-probability bin at the very end: step back to the last allowed token at
        # or before the drawn one (a max over the row, not a scan)
        positions = torch.arange(cdf.shape[-1], device=device)
        allowed = mask.index_select(0, pick) & (positions[None, :] <= drawn)
        tokens = tokens.index_copy(0, pick, torch.where(allowed, positions, -1).amax(dim=-1))
    truncated = torch.log_softmax(restricted, dim=-1)
    picked = tokens[:, None]
    values = torch.cat(
        [
            logprobs.gather(1, picked).double(),
            truncated.gather(1, picked).double(),
            tokens[:, None].double(),
            some_allowed[:, None].double(),
        ],
        dim=1,
    )
    if not logits.is_cuda:
        return LaunchedSample(tokens=tokens, values=values.cpu(), ready=None)
    on_host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    on_host.copy_(values, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return LaunchedSample(tokens=tokens, values=on_host, ready=ready)
