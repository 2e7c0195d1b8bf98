"""Success replay: a bounded per-task buffer of successful episodes, mixed into groups that
have none (ARPO, MobileRL).

An entry is a finished root episode as it was played: its turns keep the prompt ids, output
ids, log-probs and weight versions the engine produced, and its prompts' pixel tensors. A
group of a task whose played episodes all failed gets the freshest entry of that task as one
more member (``take``): a copy of its record marked ``replayed`` whose turns are the stored
ones, so its rows carry the original versions and log-probs and train as off-policy samples
(AReaL's decoupled loss on the cluster path; the PPO clip in the embedded trainer). An entry
whose oldest token is more than ``max_staleness`` versions behind the engine is dropped.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import deque
from dataclasses import dataclass, field

from cua_native.rollout.config import ReplayConfig
from cua_native.rollout.episode import EpisodeRun


def oldest_version(run: EpisodeRun) -> int:
    """The oldest weight version of any output token of the episode."""
    versions = [v for turn in run.record.turns for v in turn.output_versions]
    return min(versions) if versions else 0


@dataclass(slots=True)
class ReplayBuffer:
    """Per-task successes, at most ``config.per_task`` each (oldest dropped first)."""

    config: ReplayConfig
    _by_task: dict[str, deque[EpisodeRun]] = field(default_factory=dict)
    stored: int = 0
    replayed: int = 0
    dropped_stale: int = 0

    def add(self, run: EpisodeRun) -> bool:
        """Keep ``run`` if it is a played (not replayed, not branched) success with turns."""
        record = run.record
        if (
            not record.success
            or record.replayed
            or record.origin is not None
            or record.outcome != "completed"
            or not record.turns
        ):
            return False
        queue = self._by_task.setdefault(
            record.context.task.task_id, deque(maxlen=self.config.per_task)
        )
        queue.append(run)
        self.stored += 1
        return True

    def take(self, task_id: str, version: int) -> EpisodeRun | None:
        """The freshest stored success of ``task_id`` no more than ``max_staleness`` versions
        behind ``version`` (staler ones are dropped), as a replayed copy; ``None`` if none."""
        queue = self._by_task.get(task_id)
        while queue:
            if version - oldest_version(queue[0]) > self.config.max_staleness:
                queue.popleft()
                self.dropped_stale += 1
                continue
            break
        if not queue:
            return None
        stored = queue[-1]
        record = stored.record
        context = dataclasses.replace(
            record.context,
            episode_id=uuid.uuid4().hex,
            meta={**record.context.meta, "replay_of": record.context.episode_id},
        )
        copy = dataclasses.replace(
            record,
            context=context,
            turns=[dataclasses.replace(turn) for turn in record.turns],
            branched_at=[],
            replayed=True,
        )
        self.replayed += 1
        return EpisodeRun(record=copy, prompt_pixels=list(stored.prompt_pixels))

    def __len__(self) -> int:
        return sum(len(q) for q in self._by_task.values())
