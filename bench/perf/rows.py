"""Bytes of a group's training rows vs the size of its distinct screenshots
(docs/contracts.md#episode-screenshot-tensor).

A group of 8 episodes x 30 turns at Qwen3-VL's pixel budget: a 1080x2400 screenshot is
1088x2400 after resizing (2,550 tokens, 10,200 patch rows of 1,536 values), the history holds
the last 3 screenshots. The rows are built by the real code (``episode_multi_modal_inputs``,
``turn_sample``'s ``multi_modal_input``) on PyTorch's ``meta`` device, so nothing is allocated:
bytes are counted per distinct storage (a view of the episode's screenshot tensor counts once).

    python bench/perf/rows.py [--episodes 8] [--turns 30] [--history 3]

Prints the bytes of the rows as stored now (model dtype bf16, each screenshot once), as the
previous format stored them (float32, each turn's window concatenated), and the distinct
screenshots in bf16; target: rows <= 1.1x the distinct screenshots.
"""

from __future__ import annotations

import argparse

import torch

from cua_native.prompts.pixels import ImageFeatures, PromptPixels
from cua_native.rollout.trajectory import episode_multi_modal_inputs

GRID = (1, 68, 150)
"""1088x2400 in 16-pixel patches (Qwen3-VL: patch 16, merge 2)."""
ROW_VALUES = 3 * 2 * 16 * 16
"""channels x temporal patch x patch^2."""


def _screenshot() -> ImageFeatures:
    rows = GRID[0] * GRID[1] * GRID[2]
    return ImageFeatures(
        pixel_values=torch.empty((rows, ROW_VALUES), dtype=torch.float32, device="meta"),
        image_grid_thw=torch.tensor([GRID]),
    )


def _episode(turns: int, history: int) -> list[PromptPixels]:
    shots = [_screenshot() for _ in range(turns)]
    return [
        PromptPixels(features=tuple(shots[max(0, t + 1 - history) : t + 1])) for t in range(turns)
    ]


def _bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one tensor count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        base = t._base if t._base is not None else t
        seen[id(base)] = base.numel() * base.element_size()
    return sum(seen.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--history", type=int, default=3)
    args = parser.parse_args()
    episodes = [_episode(args.turns, args.history) for _ in range(args.episodes)]
    now: list[torch.Tensor] = []
    before = 0
    distinct = 0
    for pixels in episodes:
        now += [mm["pixel_values"] for mm in episode_multi_modal_inputs(pixels, torch.bfloat16)]
        before += sum(sum(f.pixel_values.numel() for f in p.features) * 4 for p in pixels)
        unique = {id(f): f for p in pixels for f in p.features}
        distinct += sum(f.pixel_values.numel() * 2 for f in unique.values())
    stored = _bytes(now)
    gib = 2**30
    print(
        f"group: {args.episodes} episodes x {args.turns} turns, history {args.history}, "
        f"screenshot {GRID[1] * 16}x{GRID[2] * 16} ({GRID[1] * GRID[2] // 4} tokens)"
    )
    print(f"distinct screenshots, bf16:            {distinct / gib:8.2f} GiB")
    print(
        f"rows now (bf16, each screenshot once): {stored / gib:8.2f} GiB  "
        f"{stored / distinct:.2f}x  (target <= 1.10x)"
    )
    print(
        f"rows before (fp32, window per turn):   {before / gib:8.2f} GiB  {before / distinct:.2f}x"
    )


if __name__ == "__main__":
    main()
