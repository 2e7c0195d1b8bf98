"""A decode step launched before the previous step's tokens are read (overlapped decode).

Without overlap each decode step ends with the host reading the sampled tokens, and the GPU
idles from the sampler's last kernel until the host has read them, checked the stops and
launched the next step (a quarter of a batch-1 step on an H200: see the batch-1 decode
profile in ``bench/gpu/results/engine-at-concurrency/README.md``). With overlap the worker
launches step ``t+1`` on step ``t``'s sampled tokens still on the device, and only then reads
step ``t``'s tokens (a copy to pinned memory, waited for by its event), so the host's work
runs while the GPU computes.

Contract: the tokens, log-probs and versions are the ones the step-by-step loop gives, for
every row. A row that stops at step ``t`` has had step ``t+1`` computed for it; that step's
token is dropped (its key/value land past the row's length, in a slot the row leaves) and
the uniform it drew is never used (each row has its own generator). Everything else the
worker does between steps (prefills, weight updates, pauses, aborts, cancellations) first
reads the step in flight (``drain``), so it sees every row as the step-by-step loop would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

from cua_native.engine.sampling import LaunchedSample, SampledToken

Job = TypeVar("Job")


@dataclass(eq=False)
class InFlightStep(Generic[Job]):
    """One launched decode step: its rows, their sampled tokens (not read yet), the version
    of the weights it ran under and, per row of the running batch now, its row here."""

    jobs: list[Job]
    sample: LaunchedSample
    version: int
    feed: list[int] = field(default_factory=list)
    """Row ``j`` of the running batch is row ``feed[j]`` of ``sample`` (the batch may have
    lost and reordered rows since the launch)."""

    def __post_init__(self) -> None:
        if not self.feed:
            self.feed = list(range(len(self.jobs)))

    def follow(self, order: list[int]) -> None:
        """The running batch was reordered: its row ``j`` is now what was row ``order[j]``."""
        self.feed = [self.feed[o] for o in order]

    def next_tokens(self) -> torch.Tensor:
        """The sampled tokens in the running batch's order, on the device (no host read)."""
        tokens = self.sample.tokens
        if self.feed == list(range(tokens.shape[0])):
            return tokens
        index = torch.tensor(self.feed, dtype=torch.long)
        if tokens.is_cuda:
            index = index.pin_memory().to(tokens.device, non_blocking=True)
        return tokens.index_select(0, index)

    def read(self) -> list[tuple[Job, SampledToken]]:
        """Wait for the tokens on the host; each row's job with its token."""
        return list(zip(self.jobs, self.sample.read(), strict=True))
