"""Per-turn advantages of a group: a tree of same-state sibling groups, and anchor-state groups.

Pure functions of the group's ``EpisodeRecord``s (``docs/contracts.md#per-step-credit``).

**Tree.** A group's episodes form a tree: the roots start from the task's initial state; an
episode forked at turn ``b`` of its parent (``EpisodeRecord.origin``) starts from the parent's
state before that turn, and the parent's own turn ``b`` is one more sample from that state. So
every episode splits into *segments* at its own fork turns (``branched_at``) and every state
where samples were drawn has a *sibling set*: the roots' first segments, or at a fork (e, b)
the segment of e starting at b plus the first segment of each child forked there. A segment's
value ``V`` is its episode's reward when it ends the episode, else the mean of the values of
the sibling set at its end. A segment's advantage is its ``V`` normalised within its sibling
set (``normalized_rewards``: mean and std, the mean only, or raw ``V``), and turn ``j`` of a
segment of ``L`` turns gets ``gamma ** (L - 1 - j)`` times it. Without forks each episode is one
segment and this is the group's episode advantage, discounted by turn, as before.

**Anchors** (GiGPO): turns whose observation is identical across the group's episodes (a hash
of the screenshot and the task) form a step-level group; a turn's step-level advantage is its
discounted return ``gamma ** (last - t) * R`` normalised within that group (0 alone).
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Sequence

from cua_native.gym.protocol import Observation
from cua_native.rollout.records import EpisodeRecord

Normalize = bool | str
"""``True``: mean and std; ``"mean"``: the mean only; ``False``: raw values."""


def normalized_rewards(
    rewards: Sequence[float], eps: float, *, divide_std: bool = True
) -> list[float]:
    """Group-relative episode rewards: mean 0, unbiased std 1 (one episode gives 0); with
    ``divide_std=False`` only the mean is subtracted."""
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    if n == 1:
        return [0.0]
    if not divide_std:
        return [r - mean for r in rewards]
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1))
    return [(r - mean) / (std + eps) for r in rewards]


def _normalized(values: Sequence[float], normalize: Normalize, eps: float) -> list[float]:
    if not normalize:
        return list(values)
    return normalized_rewards(values, eps, divide_std=normalize != "mean")


class OrphanBranch(ValueError):
    """A branched episode whose parent is not in the group (the parent was retried)."""


def _first_turn(record: EpisodeRecord) -> int:
    return record.origin.turn if record.origin is not None else 0


def tree_advantages(
    records: Sequence[EpisodeRecord], *, gamma: float, normalize: Normalize, eps: float
) -> list[list[float]]:
    """Each episode's per-turn advantages (one value per ``record.turns``), as the module
    docstring defines them. ``OrphanBranch`` when a child's parent is missing."""
    by_id = {r.context.episode_id: i for i, r in enumerate(records)}
    children: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, record in enumerate(records):
        if record.origin is not None:
            parent = by_id.get(record.origin.parent_id)
            if parent is None:
                raise OrphanBranch(f"episode {record.context.episode_id}'s parent is not here")
            children[(parent, record.origin.turn)].append(i)
    starts = [[_first_turn(r), *sorted(set(r.branched_at) - {_first_turn(r)})] for r in records]

    def sibling_set(episode: int, turn: int) -> list[tuple[int, int]]:
        """(episode, segment) pairs drawn from the state at ``episode``'s fork ``turn``."""
        own = (episode, starts[episode].index(turn))
        return [own, *((c, 0) for c in children.get((episode, turn), []))]

    values: dict[tuple[int, int], float] = {}

    def value(episode: int, segment: int) -> float:
        key = (episode, segment)
        if key not in values:
            if segment + 1 == len(starts[episode]):
                values[key] = records[episode].reward
            else:
                fork = sibling_set(episode, starts[episode][segment + 1])
                values[key] = sum(value(*m) for m in fork) / len(fork)
        return values[key]

    advantage: dict[tuple[int, int], float] = {}
    sets = [[(i, 0) for i, r in enumerate(records) if r.origin is None]]
    sets += [sibling_set(i, b) for i in range(len(records)) for b in starts[i][1:]]
    for members in sets:
        for member, a in zip(
            members, _normalized([value(*m) for m in members], normalize, eps), strict=True
        ):
            advantage[member] = a

    out: list[list[float]] = []
    for i, record in enumerate(records):
        bounds = starts[i]
        per_turn: list[float] = []
        indices = [t.index for t in record.turns]
        for segment, begin in enumerate(bounds):
            end = bounds[segment + 1] if segment + 1 < len(bounds) else None
            inside = [t for t in indices if t >= begin and (end is None or t < end)]
            a = advantage.get((i, segment), 0.0)
            per_turn += [gamma ** (len(inside) - 1 - j) * a for j in range(len(inside))]
        if len(per_turn) != len(record.turns):
            raise ValueError(f"episode {record.context.episode_id}: turns outside its segments")
        out.append(per_turn)
    return out


def anchor_key(task_id: str, observation: Observation) -> str:
    """The anchor of a turn: a hash of the task and the screenshot's content (pixels, encoded
    bytes, or the URL when that is all there is)."""
    digest = hashlib.blake2b(task_id.encode(), digest_size=16)
    shot = observation.screenshot
    if shot.image is not None:
        digest.update(f"{shot.image.mode}{shot.image.size}".encode())
        digest.update(shot.image.tobytes())
    elif shot.png is not None:
        digest.update(shot.png)
    else:
        digest.update((shot.url or "").encode())
    return digest.hexdigest()


def anchor_advantages(
    records: Sequence[EpisodeRecord], *, gamma: float, normalize: Normalize, eps: float
) -> tuple[list[list[float]], int]:
    """Each turn's step-level advantage within its anchor group, and the number of anchor
    groups of two or more turns. ``normalize=False`` still subtracts the group mean (a
    step-level baseline is the point of the anchor)."""
    keys: list[list[str]] = []
    returns: list[list[float]] = []
    for record in records:
        last = record.turns[-1].index if record.turns else 0
        keys.append([anchor_key(record.context.task.task_id, t.observation) for t in record.turns])
        returns.append([gamma ** (last - t.index) * record.reward for t in record.turns])
    groups: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for i, episode_keys in enumerate(keys):
        for j, key in enumerate(episode_keys):
            groups[key].append((i, j))
    out = [[0.0] * len(r.turns) for r in records]
    shared = 0
    for members in groups.values():
        if len(members) < 2:
            continue
        shared += 1
        normalized = _normalized([returns[i][j] for i, j in members], normalize or "mean", eps)
        for (i, j), a in zip(members, normalized, strict=True):
            out[i][j] = a
    return out, shared
