"""slime's side of the Rollout Buffer route, with the exact turns.

    --rollout-function-path cua_native.slime.buffer_client.generate_rollout

Runs slime's own rollout-buffer client as it is
(``slime_plugins/rollout_buffer/rollout_buffer_example.py``'s ``generate_rollout``: ``start_rollout``
with slime's arguments, ``get_rollout_data`` polled under ``--fetch-trajectory-retry-times``,
``select_rollout_data`` by ``instance_id``, slime's data buffer), then replaces each episode
sample that client built (its tokens re-tokenized from text, no log-probs, no images) by the exact
per-turn samples the buffer put in its ``metadata["cua"]`` (``samples.turn_samples_from_metadata``):
``prompt × episode × turn``, one ``rollout_id`` per episode. Run slime with
``--disable-rewards-normalization`` (the rewards are the loop's, normalised per group).
"""

from __future__ import annotations

import importlib
from typing import Any

from cua_native.slime.samples import turn_samples_from_metadata

STOCK_CLIENT = "slime_plugins.rollout_buffer.rollout_buffer_example"


def exact_groups(sample_cls: Any, groups: list[list[Any]]) -> list[list[list[Any]]]:
    """Each episode sample of ``groups`` as its exact turns; episodes numbered in order."""
    out: list[list[list[Any]]] = []
    episode = 0
    for group in groups:
        turns = []
        for sample in group:
            turns.append(turn_samples_from_metadata(sample_cls, sample, episode))
            episode += 1
        out.append(turns)
    return out


def generate_rollout(args: Any, rollout_id: int, data_buffer: Any, evaluation: bool = False) -> Any:
    """slime's rollout function (see the module docstring)."""
    stock = importlib.import_module(STOCK_CLIENT)
    groups = stock.generate_rollout(args, rollout_id, data_buffer, evaluation)
    sample_cls = importlib.import_module("slime.utils.types").Sample
    return exact_groups(sample_cls, groups)
