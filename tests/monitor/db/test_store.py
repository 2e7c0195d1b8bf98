from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from PIL import Image
from sqlalchemy import event, func, inspect, select, text
from sqlalchemy.exc import IntegrityError

from cua_native.monitor.db.schema import (
    Base,
    Environment,
    Eval,
    Obs,
    Rollout,
    StatusHistory,
    Step,
    Training,
    Turn,
)
from cua_native.monitor.db.store import MonitorStore
from cua_native.monitor.ingest import IngestError
from cua_native.monitor.screenshots import ScreenshotError, data_uri

SEED_TABLES = {
    "training",
    "baseline",
    "eval",
    "task",
    "validator",
    "step",
    "rollout",
    "turn",
    "action",
    "obs",
    "validation",
    "environment",
    "status_history",
}


def png(color: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 80), color).save(buffer, format="PNG")
    return buffer.getvalue()


def base_batch() -> dict[str, Any]:
    return {
        "training": {
            "client_id": "tr-1",
            "run_name": "run-1",
            "log_path": "/tmp/run-1",
            "model_name": "MAI-UI-2B",
            "status": "running",
            "total_steps": 4,
        },
        "tasks": [
            {"client_id": "task-a", "task_id": "a", "name": "Open settings", "description": "d"}
        ],
        "steps": [
            {
                "client_id": "step-0",
                "training_client_id": "tr-1",
                "step": 0,
                "status": "rollout_running",
                "rollout_progress": {"total_envs": 4, "total_groups": 2},
            }
        ],
        "rollouts": [
            {
                "client_id": "ro-1",
                "rollout_id": "uuid-1",
                "step_client_id": "step-0",
                "task_client_id": "task-a",
                "model_path": "m",
                "group": 0,
                "max_turns": 4,
                "status": "running",
            }
        ],
    }


def test_migration_creates_the_seed_schema(store: MonitorStore) -> None:
    inspector = inspect(store.engine)
    assert SEED_TABLES <= set(inspector.get_table_names())
    rollout_indexes = {ix["name"] for ix in inspector.get_indexes("rollout")}
    assert {"ix_rollout_source_step", "ix_rollout_status", "ix_rollout_task_id"} <= rollout_indexes
    with store.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def test_ingest_answers_ids_and_upserts_only_given_keys(store: MonitorStore) -> None:
    answer = store.ingest(base_batch())
    assert isinstance(answer["training_id"], int)
    assert [m["client_id"] for m in answer["rollouts"]] == ["ro-1"]
    rollout_id = answer["rollouts"][0]["id"]

    again = store.ingest({"rollouts": [{"client_id": "ro-1", "status_message": "env up"}]})
    assert again["rollouts"] == [{"client_id": "ro-1", "id": rollout_id}]
    with store.session() as session:
        rollout = session.get(Rollout, rollout_id)
        assert rollout is not None
        assert rollout.status == "running" and rollout.status_message == "env up"
        assert rollout.source_type == "step" and rollout.model_path == "m"
        assert session.scalar(select(func.count(Rollout.id))) == 1


def test_remote_integer_ids_work_as_foreign_keys(store: MonitorStore) -> None:
    answer = store.ingest(base_batch())
    rollout_id = answer["rollouts"][0]["id"]
    turns = store.ingest({"turns": [{"client_id": "t1", "rollout_id": rollout_id, "turn": 1}]})
    with store.session() as session:
        turn = session.get(Turn, turns["turns"][0]["id"])
        assert turn is not None and turn.rollout_id == rollout_id


def test_status_history_and_progress(store: MonitorStore) -> None:
    store.ingest(base_batch())
    store.ingest(
        {
            "turns": [
                {"client_id": "ro-1:1", "rollout_client_id": "ro-1", "turn": 1},
                {"client_id": "ro-1:2", "rollout_client_id": "ro-1", "turn": 2},
            ]
        }
    )
    with store.session() as session:
        rollout = session.scalars(select(Rollout)).one()
        assert rollout.current_turn == 2 and rollout.progress_percent == pytest.approx(50.0)
    store.ingest(
        {
            "rollouts": [
                {"client_id": "ro-1", "status": "completed", "reward": 1.0, "task_success": True}
            ],
            "steps": [{"client_id": "step-0", "training_progress": {"total_substeps": 1}}],
        }
    )
    with store.session() as session:
        rollout = session.scalars(select(Rollout)).one()
        assert rollout.progress_percent == 100.0 and rollout.num_turns == 2
        step = session.scalars(select(Step)).one()
        progress = json.loads(step.rollout_progress or "{}")
        assert progress == {
            "completed_groups": 1,
            "total_groups": 2,
            "completed_envs": 1,
            "total_envs": 4,
        }
        assert step.progress_percent == pytest.approx(20.0)
        assert step.reward_mean == 1.0
        history = session.execute(
            select(StatusHistory.old_status, StatusHistory.new_status)
            .where(StatusHistory.entity_type == "rollout")
            .order_by(StatusHistory.id)
        ).all()
        assert [tuple(h) for h in history] == [(None, "running"), ("running", "completed")]
    store.ingest({"steps": [{"client_id": "step-0", "status": "completed"}]})
    with store.session() as session:
        training = session.scalars(select(Training)).one()
        assert training.current_step == 0
        assert training.progress_percent == pytest.approx(25.0)
        statuses = session.scalars(
            select(StatusHistory.new_status).where(StatusHistory.entity_type == "step")
        ).all()
        assert statuses == ["rollout_running", "completed"]


def test_unchanged_status_writes_no_history(store: MonitorStore) -> None:
    store.ingest(base_batch())
    store.ingest({"rollouts": [{"client_id": "ro-1", "status": "running"}]})
    with store.session() as session:
        count = session.scalar(
            select(func.count(StatusHistory.id)).where(StatusHistory.entity_type == "rollout")
        )
        assert count == 1


def test_eval_rollouts_roll_up(store: MonitorStore) -> None:
    batch = base_batch()
    del batch["steps"], batch["rollouts"]
    batch["evals"] = [
        {
            "client_id": "ev-0",
            "training_client_id": "tr-1",
            "step": 0,
            "model_path": "m",
            "total_tasks": 4,
        }
    ]
    batch["rollouts"] = [
        {
            "client_id": f"ev-ro-{i}",
            "rollout_id": f"ev-uuid-{i}",
            "eval_client_id": "ev-0",
            "task_client_id": "task-a",
            "model_path": "m",
            "status": "completed",
            "reward": float(i),
            "task_success": i == 1,
            "num_turns": 3,
        }
        for i in range(2)
    ]
    store.ingest(batch)
    with store.session() as session:
        evaluation = session.scalars(select(Eval)).one()
        assert evaluation.completed_tasks == 2 and evaluation.total_tasks == 4
        assert evaluation.progress_percent == pytest.approx(50.0)
        assert evaluation.success_rate == pytest.approx(0.5)
        assert evaluation.avg_reward == pytest.approx(0.5) and evaluation.avg_turns == 3.0
        rollout = session.scalars(select(Rollout)).first()
        assert rollout is not None and rollout.source_type == "eval"


def test_database_enforces_the_rollout_source_rule(store: MonitorStore) -> None:
    answer = store.ingest(base_batch())
    step_id = answer["steps"][0]["id"]
    task_id = answer["tasks"][0]["id"]
    bad = text(
        "INSERT INTO rollout (source_type, step_id, rollout_id, task_id, model_path) "
        "VALUES ('eval', :step, 'bad', :task, 'm')"
    )
    with pytest.raises(IntegrityError), store.engine.begin() as connection:
        connection.execute(bad, {"step": step_id, "task": task_id})
    with pytest.raises(IngestError, match="database rule"):
        store.ingest(
            {
                "rollouts": [
                    {
                        "client_id": "ro-bad",
                        "rollout_id": "bad",
                        "source_type": "baseline",
                        "step_client_id": "step-0",
                        "task_client_id": "task-a",
                        "model_path": "m",
                    }
                ]
            }
        )


def test_bad_batches_are_rejected_whole(store: MonitorStore) -> None:
    store.ingest(base_batch())
    with pytest.raises(IngestError, match="unknown rollout_client_id"):
        store.ingest(
            {
                "rollouts": [{"client_id": "ro-1", "status": "failed"}],
                "turns": [{"client_id": "x", "rollout_client_id": "nope", "turn": 1}],
            }
        )
    with pytest.raises(IngestError, match="needs"):
        store.ingest({"tasks": [{"client_id": "task-b", "name": "no id"}]})
    with pytest.raises(IngestError, match="typo_field"):
        store.ingest({"tasks": [{"client_id": "task-a", "typo_field": 1}]})
    with store.session() as session:
        assert session.scalars(select(Rollout.status)).one() == "running"


def test_screenshots_are_content_addressed(store: MonitorStore) -> None:
    store.ingest(base_batch())
    red = data_uri(png((255, 0, 0)))
    store.ingest(
        {
            "turns": [{"client_id": "t1", "rollout_client_id": "ro-1", "turn": 1}],
            "observations": [
                {"client_id": "o1", "turn_client_id": "t1", "screenshot_uri": red},
                {"client_id": "o2", "turn_client_id": "t1", "screenshot_uri": red},
                {
                    "client_id": "o3",
                    "turn_client_id": "t1",
                    "screenshot_uri": "https://gym/shot.png",
                },
            ],
        }
    )
    with store.session() as session:
        uris = session.scalars(select(Obs.screenshot_uri).order_by(Obs.id)).all()
    assert uris[0] == uris[1] and uris[2] == "https://gym/shot.png"
    assert uris[0] is not None and uris[0].startswith("screenshots/")
    assert store.screenshots.resolve(uris[0]).read_bytes() == png((255, 0, 0))
    assert len(list((store.run_dir / "screenshots").rglob("*.png"))) == 1
    with pytest.raises(ScreenshotError):
        store.screenshots.resolve("../monitor.db")
    with pytest.raises(IngestError, match="base64"):
        store.ingest(
            {
                "observations": [
                    {
                        "client_id": "o4",
                        "turn_client_id": "t1",
                        "screenshot_uri": "data:image/png;base64,@@",
                    }
                ]
            }
        )


async def test_aingest_runs_off_the_loop(store: MonitorStore) -> None:
    answer = await store.aingest(base_batch())
    assert answer["steps"][0]["client_id"] == "step-0"


def test_reopen_is_idempotent(db_url: str, tmp_path: Path) -> None:
    for _ in range(2):
        opened = MonitorStore.open(db_url, run_dir=tmp_path / "run")
        opened.close()


def test_training_update_by_remote_id(store: MonitorStore) -> None:
    training_id = store.ingest(base_batch())["training_id"]
    again = store.ingest({"training": {"training_id": training_id, "status": "completed"}})
    assert again["training_id"] == training_id
    with store.session() as session:
        training = session.get(Training, training_id)
        assert training is not None and training.status == "completed"
        assert training.progress_percent == 100.0
    with pytest.raises(IngestError, match="unknown training_id"):
        store.ingest({"training": {"training_id": 999999, "status": "failed"}})


def test_a_record_sent_twice_in_one_batch_is_one_row(store: MonitorStore) -> None:
    batch = base_batch()
    batch["rollouts"].append(
        {"client_id": "ro-1", "status": "completed", "reward": 1.0, "task_success": True}
    )
    answer = store.ingest(batch)
    first, second = (m["id"] for m in answer["rollouts"])
    assert first == second
    with store.session() as session:
        rollout = session.scalars(select(Rollout)).one()
        assert rollout.status == "completed" and rollout.reward == 1.0
        assert rollout.source_type == "step" and rollout.progress_percent == 100.0
        history = session.execute(
            select(StatusHistory.old_status, StatusHistory.new_status)
            .where(StatusHistory.entity_type == "rollout")
            .order_by(StatusHistory.id)
        ).all()
        assert [tuple(h) for h in history] == [(None, "running"), ("running", "completed")]


def _episode(index: int) -> dict[str, Any]:
    rollout = f"ep-{index}"
    return {
        "rollouts": [
            {
                "client_id": rollout,
                "rollout_id": rollout,
                "step_client_id": "step-0",
                "task_client_id": "task-a",
                "model_path": "m",
                "status": "completed",
                "reward": 1.0,
            }
        ],
        "turns": [
            {"client_id": f"{rollout}:{t}", "rollout_client_id": rollout, "turn": t}
            for t in range(1, 4)
        ],
        "actions": [
            {"client_id": f"{rollout}:{t}:a", "turn_client_id": f"{rollout}:{t}", "tokens": ["x"]}
            for t in range(1, 4)
        ],
    }


def test_statements_per_batch_do_not_grow_with_its_records(store: MonitorStore) -> None:
    """Set-based writes: a batch of 12 episodes costs the statements of a batch of one."""
    store.ingest(base_batch())
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        store.ingest(_episode(0))
        one = len(statements)
        statements.clear()
        batch: dict[str, list[Any]] = {}
        for index in range(1, 13):
            for kind, records in _episode(index).items():
                batch.setdefault(kind, []).extend(records)
        answer = store.ingest(batch)
        many = len(statements)
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
    assert len(answer["actions"]) == 36
    assert many <= one, f"{many} statements for 12 episodes, {one} for one"
    with store.session() as session:
        assert session.scalar(select(func.count(Turn.id))) == 39
        step = session.scalars(select(Step)).one()
        assert step.num_trajectories == 13


def test_step_figures_survive_repeated_and_duplicate_updates(store: MonitorStore) -> None:
    """A rollout re-sent with the same client_id, updated twice, or sent twice in one batch
    counts once: after every batch the step's figures equal those computed here from the
    latest value of each rollout."""
    store.ingest(base_batch())
    latest: dict[str, dict[str, Any]] = {"ro-1": {"status": "running", "group": 0}}
    batches: list[list[dict[str, Any]]] = [
        [
            {
                "client_id": f"r{i}",
                "rollout_id": f"r{i}",
                "step_client_id": "step-0",
                "task_client_id": "task-a",
                "model_path": "m",
                "group": i % 3,
                "status": "running",
            }
            for i in range(6)
        ],
        [
            {"client_id": "r0", "status": "completed", "reward": 1.0},
            {"client_id": "r1", "status": "completed", "reward": 0.0},
        ],
        # the same records re-sent (a retry after a lost acknowledgement)
        [
            {"client_id": "r0", "status": "completed", "reward": 1.0},
            {"client_id": "r1", "status": "completed", "reward": 0.0},
        ],
        # updated again, and one sent twice in one batch with different values
        [
            {"client_id": "r1", "reward": 0.5},
            {"client_id": "r2", "status": "failed", "reward": -1.0},
            {"client_id": "r2", "status": "completed", "reward": 0.25},
        ],
        [
            {"client_id": "ro-1", "status": "completed", "reward": 2.0},
            {"client_id": "r3", "status": "completed", "reward": 1.0},
            {"client_id": "r0", "reward": 0.0},
        ],
    ]
    for batch in batches:
        store.ingest({"rollouts": batch})
        for record in batch:
            latest.setdefault(record["client_id"], {}).update(
                {k: v for k, v in record.items() if k in ("status", "reward", "group")}
            )
        done = [r for r in latest.values() if r["status"] == "completed" or r["status"] == "failed"]
        rewards = [r["reward"] for r in done if r.get("reward") is not None]
        groups = {r["group"] for r in latest.values()}
        open_groups = {r["group"] for r in latest.values() if r not in done}
        with store.session() as session:
            step = session.scalars(select(Step)).one()
            progress = json.loads(step.rollout_progress or "{}")
        assert progress == {
            "completed_groups": len(groups - open_groups),
            "total_groups": max(2, len(groups)),
            "completed_envs": len(done),
            "total_envs": max(4, len(latest)),
        }
        if rewards:
            mean = sum(rewards) / len(rewards)
            std = (sum(r * r for r in rewards) / len(rewards) - mean * mean) ** 0.5
            assert step.num_trajectories == len(done)
            assert step.reward_mean == pytest.approx(mean)
            assert step.reward_std == pytest.approx(std)


class _Aborted(Exception):
    """A driver error as psycopg raises it, with PostgreSQL's SQLSTATE."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"SQLSTATE {sqlstate}")
        self.sqlstate = sqlstate


def _fail_first(store: MonitorStore, monkeypatch: pytest.MonkeyPatch, sqlstate: str) -> list[int]:
    from sqlalchemy.exc import OperationalError

    calls: list[int] = []
    real = store._apply

    def apply(parsed: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            with store.engine.begin() as connection:  # a transaction, rolled back as PG does
                connection.execute(text("SELECT 1"))
                raise OperationalError("INSERT ...", {}, _Aborted(sqlstate))
        return real(parsed)

    monkeypatch.setattr(store, "_apply", apply)
    return calls


def test_a_batch_aborted_as_a_deadlock_is_applied_again(
    store: MonitorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fail_first(store, monkeypatch, "40P01")  # deadlock_detected
    answer = store.ingest(base_batch())
    assert len(calls) == 2 and answer["training_id"]
    with store.session() as session:
        assert session.scalar(select(func.count()).select_from(Training)) == 1


def test_other_database_errors_are_not_retried(
    store: MonitorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.exc import OperationalError

    calls = _fail_first(store, monkeypatch, "53100")  # disk_full
    with pytest.raises(OperationalError):
        store.ingest(base_batch())
    assert len(calls) == 1


def _ahead(step: int, rollout: str, status: str | None = None) -> dict[str, Any]:
    """What a rollout worker sends for a step the trainer may never reach: the step without a
    status (the worker does not own it), a running rollout and its running environment."""
    step_record: dict[str, Any] = {
        "client_id": f"step-{step}",
        "training_client_id": "tr-1",
        "step": step,
    }
    if status is not None:
        step_record["status"] = status
    return {
        "steps": [step_record],
        "rollouts": [
            {
                "client_id": rollout,
                "rollout_id": rollout,
                "step_client_id": f"step-{step}",
                "task_client_id": "task-a",
                "model_path": "m",
                "status": "running",
            }
        ],
        "environments": [
            {
                "client_id": f"{rollout}:env",
                "rollout_client_id": rollout,
                "env_type": "android",
                "status": "running",
            }
        ],
    }


def _states(store: MonitorStore) -> dict[str, Any]:
    with store.session() as session:
        return {
            "steps": {s.step: (s.status, s.error_message) for s in session.scalars(select(Step))},
            "rollouts": {
                r.rollout_id: (r.status, r.error_message) for r in session.scalars(select(Rollout))
            },
            "environments": {e.client_id: e.status for e in session.scalars(select(Environment))},
        }


NEVER_TRAINED = ("failed", "never trained: the training completed before this step's update")
LEFT_OPEN = ("cancelled", "still open when the training completed")


def test_a_completed_training_leaves_nothing_open(store: MonitorStore) -> None:
    """AReaL generates ahead: when the last step has trained, rollouts of the next step are
    running and that step exists. The training's end closes them, saying why; what finished
    stays as it was, and a step in its update (which may have trained) is left to its own end."""
    store.ingest(base_batch())
    store.ingest({"rollouts": [{"client_id": "ro-1", "status": "completed", "reward": 1.0}]})
    store.ingest({"steps": [{"client_id": "step-0", "status": "completed"}]})
    store.ingest(_ahead(1, "ro-ahead"))
    store.ingest(_ahead(2, "ro-updating", status="training"))
    store.ingest({"training": {"client_id": "tr-1", "status": "completed"}})
    states = _states(store)
    assert states["steps"] == {0: ("completed", None), 1: NEVER_TRAINED, 2: ("training", None)}
    assert states["rollouts"] == {
        "uuid-1": ("completed", None),
        "ro-ahead": LEFT_OPEN,
        "ro-updating": LEFT_OPEN,
    }
    assert set(states["environments"].values()) == {"terminated"}


def test_rows_that_arrive_after_the_end_are_closed_on_arrival(store: MonitorStore) -> None:
    """A worker's rows may reach the store after the trainer's end (each process has its own
    recorder): they are closed in the batch that brings them, and a later update of an
    environment back to running is closed again."""
    store.ingest(base_batch())
    store.ingest({"training": {"client_id": "tr-1", "status": "completed"}})
    store.ingest(_ahead(1, "ro-late"))
    states = _states(store)
    assert states["steps"][1] == NEVER_TRAINED and states["rollouts"]["ro-late"] == LEFT_OPEN
    assert states["environments"] == {"ro-late:env": "terminated"}
    store.ingest({"environments": [{"client_id": "ro-late:env", "status": "running"}]})
    assert _states(store)["environments"] == {"ro-late:env": "terminated"}


def test_a_failed_training_ends_the_environments_of_finished_rollouts(store: MonitorStore) -> None:
    """A run killed (``kill -9``) between a rollout's end and its environment's: the next run
    marks the training failed, which ends every environment still open, not only those of
    open rollouts."""
    store.ingest(base_batch())
    store.ingest(
        {
            "rollouts": [{"client_id": "ro-1", "status": "completed"}],
            "environments": [
                {
                    "client_id": "ro-1:env",
                    "rollout_client_id": "ro-1",
                    "env_type": "android",
                    "status": "running",
                }
            ],
        }
    )
    store.ingest({"training": {"client_id": "tr-1", "status": "failed"}})
    states = _states(store)
    assert states["environments"] == {"ro-1:env": "terminated"}
    assert states["rollouts"] == {"uuid-1": ("completed", None)}
    assert states["steps"] == {0: ("failed", "training failed")}
