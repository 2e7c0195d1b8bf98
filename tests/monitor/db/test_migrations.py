"""Migration 0002 upgrades a database written under 0001 (SQLite and PostgreSQL) without
losing a row, and the upgraded database takes the existing client's records."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from sqlalchemy import text
from sqlalchemy.engine import Engine

from cua_native.monitor.db.migrations.runner import (
    alembic_config,
    current_revision,
    upgrade_to_head,
)
from cua_native.monitor.db.store import MonitorStore, make_engine


def _past_inserted_ids(engine: Engine, tables: tuple[str, ...], last: int) -> None:
    """PostgreSQL's id sequences moved past rows inserted with explicit ids up to ``last``."""
    if engine.dialect.name == "postgresql":
        with engine.begin() as c:
            for table in tables:
                c.execute(text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), {last})"))


def _at_0001(url: str) -> None:
    engine = make_engine(url)
    try:
        config = alembic_config(engine)
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "0001")
        with engine.begin() as c:
            c.execute(
                text(
                    "INSERT INTO training (id, run_name, log_path, model_name, status) "
                    "VALUES (1, 'old-run', '/runs/old', 'm', 'completed')"
                )
            )
            c.execute(
                text("INSERT INTO task (id, task_id, name, description) VALUES (1, 't', 'T', 'd')")
            )
            c.execute(
                text(
                    "INSERT INTO step (id, training_id, step, status) VALUES (1, 1, 0, 'completed')"
                )
            )
            c.execute(
                text(
                    "INSERT INTO rollout (id, source_type, step_id, rollout_id, task_id, model_path,"
                    " status, reward) VALUES (1, 'step', 1, 'r-old', 1, 'm', 'completed', 0.5)"
                )
            )
            c.execute(
                text(
                    "INSERT INTO environment (id, rollout_id, env_type, status) "
                    "VALUES (1, 1, 'sim', 'terminated')"
                )
            )
        _past_inserted_ids(engine, ("training", "task", "step", "rollout", "environment"), 1)
    finally:
        engine.dispose()


def test_0002_upgrades_a_populated_database(db_url: str, tmp_path: Path) -> None:
    _at_0001(db_url)
    engine = make_engine(db_url)
    try:
        assert current_revision(engine) == "0001"
        upgrade_to_head(engine)
        assert current_revision(engine) == "0003"
        with engine.connect() as c:
            old = c.execute(
                text("SELECT reward, env_id FROM rollout WHERE rollout_id='r-old'")
            ).one()
            assert tuple(old) == (0.5, None)
            assert c.execute(text("SELECT rollout_id FROM environment")).scalar_one() == 1
    finally:
        engine.dispose()
    store = MonitorStore.open(db_url, run_dir=tmp_path / "run")
    try:
        answer = store.ingest(
            {
                "environments": [{"client_id": "new:env", "env_type": "genv", "status": "created"}],
            }
        )
        env_id = answer["environments"][0]["id"]
        answer = store.ingest(
            {
                "rollouts": [
                    {
                        "client_id": "new",
                        "rollout_id": "new",
                        "source_type": "step",
                        "step_id": 1,
                        "env_id": env_id,
                        "task_id": 1,
                        "model_path": "m",
                        "group_num": 2,
                        "gbox_run_id": "run-1",
                        "trajectory_data_json": '{"turns": []}',
                    }
                ],
                "actions": [],
            }
        )
        with store.session() as session:
            row = session.execute(
                text(
                    'SELECT e.rollout_id, r."group", r.gbox_run_id FROM environment e '
                    "JOIN rollout r ON r.env_id = e.id WHERE r.rollout_id = 'new'"
                )
            ).one()
        assert tuple(row) == (answer["rollouts"][0]["id"], 2, "run-1")
    finally:
        store.close()


def test_0003_fills_the_step_tallies_of_a_populated_database(db_url: str, tmp_path: Path) -> None:
    """Rollouts stored before the tallies existed are counted in them by the upgrade, and the
    next batch's changes add to those counts."""
    engine = make_engine(db_url)
    try:
        config = alembic_config(engine)
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "0002")
        rollouts = [  # (id, group_id, group, status, reward)
            (1, "a", None, "completed", 1.0),
            (2, "a", None, "running", None),
            (3, None, 7, "completed", 0.5),
            (4, "7", None, "failed", None),
            (5, None, None, "cancelled", -1.0),
            (6, None, None, None, None),
        ]
        with engine.begin() as c:
            c.execute(
                text(
                    "INSERT INTO training (id, run_name, log_path, model_name, status) "
                    "VALUES (1, 'old-run', '/runs/old', 'm', 'running')"
                )
            )
            c.execute(
                text("INSERT INTO task (id, task_id, name, description) VALUES (1, 't', 'T', 'd')")
            )
            c.execute(
                text(
                    "INSERT INTO step (id, client_id, training_id, step, status) "
                    "VALUES (1, 'step-old', 1, 0, 'rollout_running')"
                )
            )
            for row_id, group_id, group, status, reward in rollouts:
                c.execute(
                    text(
                        "INSERT INTO rollout (id, client_id, source_type, step_id, rollout_id, task_id,"
                        ' model_path, group_id, "group", status, reward) VALUES (:id, :cid, '
                        "'step', 1, :rid, 1, 'm', :group_id, :group, :status, :reward)"
                    ),
                    {
                        "id": row_id,
                        "cid": f"r{row_id}",
                        "rid": f"r{row_id}",
                        "group_id": group_id,
                        "group": group,
                        "status": status,
                        "reward": reward,
                    },
                )
        _past_inserted_ids(engine, ("training", "task", "step", "rollout"), 10)
        upgrade_to_head(engine)
        with engine.connect() as c:
            tallies = c.execute(
                text(
                    "SELECT tally_rollouts, tally_finished, tally_rewarded, tally_reward_sum,"
                    " tally_reward_squares, tally_groups, tally_complete_groups FROM step"
                )
            ).one()
            groups = {
                key: count
                for key, count in c.execute(text("SELECT group_key, open_rollouts FROM step_group"))
            }
        # groups: "a" (one open), "7" (group 7 and group_id "7": complete), none (complete:
        # a rollout without status is not open)
        assert tuple(tallies) == (6, 4, 3, 0.5, 2.25, 3, 2)
        assert groups == {"g:a": 1, "g:7": 0, "-": 0}
    finally:
        engine.dispose()
    store = MonitorStore.open(db_url, run_dir=tmp_path / "run")
    try:
        store.ingest({"rollouts": [{"client_id": "r2", "status": "completed", "reward": 2.0}]})
        with store.session() as session:
            row = session.execute(
                text("SELECT tally_finished, tally_complete_groups, rollout_progress FROM step")
            ).one()
        assert (row[0], row[1]) == (5, 3)
        assert '"completed_groups": 3' in row[2] and '"completed_envs": 5' in row[2]
    finally:
        store.close()
