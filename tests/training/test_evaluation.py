"""The one evaluation: ``python -m cua_native.evaluate`` runs the embedded trainer's own
evaluation, so on the same config and seed its figures are the trainer's baseline; ``--tasks``
reads task numbers as the task sources do (``sim-001`` is 1)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from cua_native import evaluate
from cua_native.config import load_config
from cua_native.gym.sim import SimGym
from cua_native.rollout.dataset import TaskSource, TaskSourceError, load_tasks
from cua_native.rollout.records import EpisodeTally
from cua_native.rollout.runtime import with_cpu_pool
from cua_native.training.embedded.evaluation import eval_task_source

ROOT = Path(__file__).resolve().parents[2]


def _ids(tasks: list[Any]) -> list[tuple[str, int | None]]:
    return [(task.task_id, task.gym_seed) for task in tasks]


def test_tasks_are_read_as_task_numbers() -> None:
    gym = SimGym()
    chosen = asyncio.run(load_tasks(eval_task_source(TaskSource(), None, "1-3"), gym))
    assert [t.task_id for t in chosen] == ["sim-001", "sim-002", "sim-003"]
    chosen = asyncio.run(load_tasks(eval_task_source(TaskSource(), None, "7,2"), gym))
    assert [t.task_id for t in chosen] == ["sim-002", "sim-007"]
    chosen = asyncio.run(load_tasks(eval_task_source(TaskSource(), None, "sim-004,sim-009"), gym))
    assert [t.task_id for t in chosen] == ["sim-004", "sim-009"]


def test_tasks_narrow_the_configs_eval_tasks_and_keep_their_phones() -> None:
    cua = load_config(ROOT / "configs" / "default.yaml").cua
    assert cua.eval_tasks is not None
    source = eval_task_source(cua.tasks, cua.eval_tasks, "1-2")
    chosen = asyncio.run(load_tasks(source, SimGym()))
    seeds = cua.eval_tasks.gym_seeds or []
    assert sorted(_ids(chosen)) == sorted((f"sim-00{n}", s) for n in (1, 2) for s in seeds)
    everything = asyncio.run(load_tasks(eval_task_source(cua.tasks, cua.eval_tasks), SimGym()))
    assert len(everything) == len(cua.eval_tasks.task_ids or []) * len(seeds)


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        ("3-1", "runs backwards"),
        ("1,sim-002", "mixes task numbers and task ids"),
        ("sim-999", "unknown task ids"),
        (",", "selects no task"),
        ("0-0", "selects no task"),
    ],
)
def test_bad_selections_are_one_clear_error(selection: str, message: str) -> None:
    with pytest.raises(TaskSourceError, match=message):
        asyncio.run(load_tasks(eval_task_source(TaskSource(), None, selection), SimGym()))


def _figures(tally: EpisodeTally) -> tuple[Any, ...]:
    return (
        tally.completed,
        tally.rejected,
        tally.successes,
        sorted(tally.rewards),
        sorted(tally.turns),
        tally.parse_errors,
        tally.false_done,
        tally.token_mismatches,
    )


@pytest.mark.slow
def test_evaluate_reproduces_the_trainers_baseline(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """One config and seed: the trainer's baseline (after its warm start) and ``evaluate`` give
    the same episodes' figures, task by task, from the same (cached) warm-started model."""
    import torch._dynamo

    from cua_native.training.embedded.trainer import EmbeddedTrainer

    # what train does on CPU, through dynamo's own patch: monkeypatch's undo deletes the option
    # from dynamo's config module, and a later ``config.patch(disable=...)`` then fails
    dynamo_off = torch._dynamo.config.patch(disable=True)
    dynamo_off.__enter__()
    request.addfinalizer(lambda: dynamo_off.__exit__(None, None, None))
    overrides = [
        "seed=3",
        "cua.monitor_db=null",
        "cua.tasks.task_ids=[sim-001,sim-002]",
        "cua.tasks.gym_seeds=[0]",
        "cua.eval_tasks.task_ids=[sim-001,sim-002]",
        "cua.eval_tasks.gym_seeds=[1000]",
        "cua.eval_episodes_per_task=2",
        "cua.eval_every=0",
        "cua.warm_start.steps=2",
        "cua.warm_start.batch_size=2",
        "cua.warm_start.gym_seeds=[0]",
        "cua.agent.group_size=2",
        "cua.agent.max_turns=2",
        "total_train_steps=1",
        "train_dataset.batch_size=1",
    ]
    config = str(ROOT / "configs" / "default.yaml")
    trained = load_config(config, [*overrides, f"cua.run_dir={tmp_path / 'train'}"])
    report = asyncio.run(with_cpu_pool(EmbeddedTrainer(trained, progress=False).run()))
    baseline = report.evaluations[-1]

    args = evaluate.parse_args(
        ["--config", config, "--run-dir", str(tmp_path / "eval"), "--no-progress", *overrides]
    )
    result, model, leaked = asyncio.run(
        with_cpu_pool(evaluate.run_evaluation(args, evaluate.build_config(args)))
    )

    assert model == report.model_dir and model.name.startswith("tiny-qwen3-vl-warm-")
    assert leaked == 0 and result.failed_groups == baseline.failed_groups == 0
    assert result.total.episodes == baseline.total.episodes == 4
    assert sorted(result.per_task) == sorted(baseline.per_task) == ["sim-001", "sim-002"]
    for task_id, tally in baseline.per_task.items():
        assert _figures(result.per_task[task_id]) == _figures(tally), task_id
    assert result.outcomes.keys() == baseline.outcomes.keys()
    for task_id, wins in baseline.outcomes.items():
        assert sorted(result.outcomes[task_id]) == sorted(wins)
