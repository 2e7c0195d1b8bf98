"""The chaos bench's bookkeeping: its fault profile is one the gym server accepts, its reading
of the server's log finds the damaged executions, and its ledger tells trained executions
from those restored by replay and from dropped groups."""

from __future__ import annotations

from bench.experiments.chaos import FAULT_KINDS, Ledger, fault_profile, read_gym_log
from cua_native.gym.faults import FaultProfile
from cua_native.gym.protocol import Task
from cua_native.rollout.records import EpisodeContext, EpisodeRecord


def test_each_fault_kind_gets_its_share_and_drops_come_after_the_route_ran() -> None:
    profile = FaultProfile.model_validate(fault_profile(0.2, 3, 6.0, 3.0))
    for table in ("crash_share", "stall_share", "throttle_share", "error_share"):
        assert getattr(profile, table) == {"*": 0.2 / len(FAULT_KINDS)}
    assert profile.drop_after_share == {"*": 0.04} and profile.drop_share == {}
    assert profile.create_hang.share == 0.04 and profile.seed == 3


LOG = """\
INFO:cua_native.gym.server:fault=crash route=observation path=/api/v1/sim/executions/sim-0-1/observation
INFO:cua_native.gym.server:fault=stall route=actions path=/api/v1/sim/executions/sim-0-2/actions
INFO:cua_native.gym.server:fault=drop_after route=actions path=/api/v1/sim/executions/sim-0-3/actions
INFO:cua_native.gym.server:repeated action key=sim-0-3:0 path=/api/v1/sim/executions/sim-0-3/actions
INFO:cua_native.gym.server:fault=throttle route=create path=/api/v1/sim/tasks/sim-001
INFO:     127.0.0.1:1 - "POST /api/v1/sim/executions/sim-0-3/actions HTTP/1.1" 200 OK
"""


def test_action_faults_damage_only_where_actions_are_not_idempotent() -> None:
    faults, damaged, repeated = read_gym_log(LOG, keyed_actions=True)
    assert dict(faults) == {"crash": 1, "stall": 1, "drop_after": 1, "throttle": 1}
    assert damaged == {"sim-0-1"} and repeated == 1
    _, damaged, _ = read_gym_log(LOG, keyed_actions=False)
    assert damaged == {"sim-0-1", "sim-0-2", "sim-0-3"}


def _finished(
    ledger: Ledger,
    group: str,
    execution: str,
    *,
    rejected: bool = False,
    attempt: int = 0,
    lost: tuple[str, ...] = (),
) -> None:
    context = EpisodeContext(task=Task(task_id="t"), group_id=group, attempt=attempt)
    context.execution_id = execution
    record = EpisodeRecord(context=context, lost_executions=list(lost))
    record.outcome = "rejected" if rejected else "completed"
    ledger.episode_finished(record)


def test_the_ledger_tells_trained_restored_and_dropped_apart() -> None:
    ledger = Ledger(infra_retries=1)
    _finished(ledger, "g1", "sim-0-5", lost=("sim-0-1",))  # restored once, ended on 5
    _finished(ledger, "g1", "sim-0-6")
    _finished(ledger, "g2", "sim-0-7", lost=("sim-0-2",))
    _finished(ledger, "g2", "sim-0-8", rejected=True, attempt=0)  # retried: group kept
    _finished(ledger, "g2", "sim-0-9")
    _finished(ledger, "g3", "sim-0-10", lost=("sim-0-3",))
    _finished(ledger, "g3", "sim-0-11", rejected=True, attempt=1)  # last try: group dropped
    assert ledger.trained() == {"sim-0-5", "sim-0-6", "sim-0-7", "sim-0-9"}
    assert ledger.restored() == {"sim-0-1", "sim-0-2"}
    assert ledger.rejected == {"sim-0-8", "sim-0-11"} and ledger.dropped == {"g3"}
