"""The Rollout Buffer route: slime's own client (``rollout_buffer_example.generate_rollout``,
vendored at the pinned commit, run unchanged) against ``python -m cua_native.slime buffer``'s
server, generating through the stand-in SGLang server on the simulator.

slime's client starts the rollout with its arguments, polls ``/get_rollout_data``, groups the
items by ``instance_id`` and fills its data buffer; ``buffer_client`` then swaps each episode
sample it built (re-tokenized text) for the exact per-turn samples the item carries, checked
here against what the server built and answered. The answers also validate against slime's own
``BufferResponse`` model.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from cua_native.config import load_config
from cua_native.rollout.episode import EpisodeRun
from cua_native.rollout.records import EpisodeContext, EpisodeRecord
from cua_native.slime import buffer_client
from cua_native.slime.__main__ import main
from cua_native.slime.buffer import RolloutBuffer, StartError, build_app, read_rows

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "default.yaml")


def settings(run_dir: Path, *extra: str) -> Any:
    overrides = [
        f"cua.run_dir={run_dir}",
        "cua.monitor_db=null",
        "cua.agent.max_turns=2",
        "cua.tasks.task_ids=[sim-001,sim-002]",
        "cua.tasks.gym_seeds=[0]",
        *extra,
    ]
    return load_config(CONFIG, overrides).cua


def test_slime_client_gets_whole_groups_of_exact_turns(
    sglang: Any,
    args_for: Any,
    tasks_file: Path,
    tmp_path: Path,
    serve_app: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import slime_plugins.rollout_buffer.rollout_buffer_example as stock
    from slime.observability.rollout_data_utils import validate_rollout_id_annotated
    from slime.rollout.data_source import RolloutDataSourceWithBuffer
    from slime.utils.types import Sample

    buffer = RolloutBuffer(settings(tmp_path / "run", "cua.agent.group_reward_norm=false"))
    stock_groups: list[Any] = []
    original = stock.generate_rollout

    def spy(*args: Any, **kwargs: Any) -> Any:
        stock_groups.extend(original(*args, **kwargs))
        return stock_groups

    monkeypatch.setattr(stock, "generate_rollout", spy)
    monkeypatch.setattr(stock, "START_ROLLOUT", True)
    with serve_app(build_app(buffer)) as (host, port):
        args = args_for(
            sglang,
            tmp_path / "run",
            rollout_buffer_url=f"http://{host}:{port}",
            rollout_task_type="cua",
            prompt_data=str(tasks_file),
            num_epoch=1,
            fetch_trajectory_retry_times=3,
            loss_mask_type="qwen",
            use_wandb=False,
            use_tensorboard=False,
            rollout_global_dataset=False,
        )
        data_buffer = RolloutDataSourceWithBuffer(args)
        groups = buffer_client.generate_rollout(args, 0, data_buffer)

    # slime's client: whole groups of n episodes, keyed by instance_id, our rewards
    ids = {json.loads(line)["instance_id"] for line in tasks_file.read_text().splitlines()}
    assert len(stock_groups) == 2 and {g[0].index for g in stock_groups} == ids
    for group in stock_groups:
        assert len(group) == args.n_samples_per_prompt
        assert len({s.index for s in group}) == 1
        for sample in group:
            assert isinstance(sample, Sample)
            assert sample.reward == sample.metadata["raw_reward"]  # group_reward_norm=false

    validate_rollout_id_annotated(groups)
    calls = {tuple(c.response.output_tokens): c for c in sglang.calls}
    assert len(calls) == len(sglang.calls)
    episodes = [episode for group in groups for episode in group]
    assert len({e[0].rollout_id for e in episodes}) == len(episodes) == 4
    turns = 0
    for episode, stock_sample in zip(episodes, [s for g in stock_groups for s in g], strict=True):
        raw = stock_sample.metadata["raw_reward"]
        assert [s.reward for s in episode] == [
            0.9 ** (len(episode) - 1 - t) * raw for t in range(len(episode))
        ]
        for sample in episode:
            turns += 1
            call = calls[tuple(sample.tokens[-sample.response_length :])]
            assert sample.index == stock_sample.index
            assert sample.tokens == call.built + call.response.output_tokens
            assert sample.loss_mask == [1] * sample.response_length
            assert sample.rollout_log_probs == [float(x) for x in call.response.output_logprobs]
            assert sample.weight_versions == [str(call.version)]
            grid = sample.multimodal_train_inputs["image_grid_thw"]
            assert sample.multimodal_train_inputs["pixel_values"].shape[0] == int(
                grid.prod(dim=1).sum()
            )
            sample._validate_response_metadata_lengths()
    assert turns == len(sglang.calls)


async def test_buffer_answers_as_slimes_buffer_and_refuses_bad_starts(
    tmp_path: Path, tasks_file: Path
) -> None:
    from slime_plugins.rollout_buffer.buffer import BufferResponse

    app = build_app(RolloutBuffer(settings(tmp_path / "run")))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://buffer") as client:
        empty = (await client.post("/get_rollout_data", json={})).json()
        assert BufferResponse.model_validate(empty).success is False
        assert empty["data"] == {"data": [], "meta_info": empty["data"]["meta_info"]}
        good = {
            "num_process": "4",
            "num_epoch": "1",
            "remote_engine_url": "http://127.0.0.1:1",
            "task_type": "cua",
            "input_file": str(tasks_file),
            "num_repeat_per_sample": "2",
            "max_tokens": "16",
            "sampling_params": {"max_tokens": 16, "temperature": 1.0, "top_p": 1.0},
            "tokenizer_path": "unused",
            "skip_instance_ids": [],
        }
        for change, words in [
            ({"task_type": "math"}, "--rollout-task-type cua"),
            ({"input_file": str(tmp_path / "none.jsonl")}, "is not a file"),
            ({"num_repeat_per_sample": "x"}, "not a whole number"),
            ({"remote_engine_url": "sglang:30000"}, "is not http(s)://host:port"),
            ({"sampling_params": {"top_p": 0.9, "max_tokens": 16}}, "--rollout-top-p 1"),
        ]:
            answer = await client.post("/start_rollout", json={**good, **change})
            assert answer.status_code == 400
            detail = answer.json()["detail"]
            assert words in detail and "\n" not in detail


def test_input_rows_skip_finished_instances(tasks_file: Path) -> None:
    ids = [json.loads(line)["instance_id"] for line in tasks_file.read_text().splitlines()]
    assert [r["instance_id"] for r in read_rows(tasks_file, frozenset(ids[:1]))] == ids[1:]
    with pytest.raises(StartError, match="no task left"):
        read_rows(tasks_file, frozenset(ids))


def test_a_dropped_group_is_never_sent(tmp_path: Path) -> None:
    buffer = RolloutBuffer(settings(tmp_path / "run"))
    buffer._add("a", None, 0.9, True, 1e-6)  # an episode rejected again
    context = EpisodeContext(task=_task())
    no_turn = [
        EpisodeRun(EpisodeRecord(context=context)),
        EpisodeRun(EpisodeRecord(context=context)),
    ]
    buffer._add("b", no_turn, 0.9, True, 1e-6)  # an episode without a turn
    answer = buffer.read()
    assert answer["success"] is False
    assert answer["data"]["meta_info"]["dropped_groups"] == 2
    assert answer["data"]["meta_info"]["finished_groups"] == []


def _task() -> Any:
    from cua_native.gym.protocol import Task

    return Task(task_id="t", instruction="Open Settings")


def test_command_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, words in [
        (["buffer", "--port", "70000"], "--port 70000"),
        (["buffer", "--config", str(tmp_path / "none.yaml")], "none.yaml"),
        (["buffer", "cua.agent.max_turnz=2"], "max_turnz"),
        (["tasks", "--out", str(tmp_path / "no" / "dir.jsonl")], "--out"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and "\n" not in err, err
    with pytest.raises(SystemExit) as exit_:
        main(["serve"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "invalid choice" in err and "\n" not in err, err


def test_running_producer_is_not_started_twice(tmp_path: Path, tasks_file: Path) -> None:
    async def scenario() -> None:
        buffer = RolloutBuffer(settings(tmp_path / "run"))
        blocker = asyncio.Event()
        buffer.producer = asyncio.ensure_future(blocker.wait())
        assert await buffer.start({}) == {"message": "Rollout already running"}
        await buffer.aclose()

    asyncio.run(scenario())


def test_buffer_command_serves_until_stopped(tmp_path: Path) -> None:
    import os
    import selectors
    import signal
    import subprocess
    import sys

    command = [
        sys.executable,
        "-m",
        "cua_native.slime",
        "buffer",
        "--config",
        CONFIG,
        "--port",
        "0",
    ]
    command += [f"cua.run_dir={tmp_path / 'run'}", "cua.monitor_db=sqlite"]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert proc.stdout is not None
        ready = selectors.DefaultSelector()
        ready.register(proc.stdout, selectors.EVENT_READ)
        assert ready.select(timeout=600.0), "the buffer printed nothing in 10 minutes"
        line = proc.stdout.readline().strip()  # the ready line, or EOF if it died
        assert line.startswith("rollout buffer on http://127.0.0.1:"), (
            proc.stderr.read() if proc.stderr else line
        )
        answer = httpx.post(
            f"{line.rsplit(' ', 1)[1]}/get_rollout_data", json={}, timeout=60.0
        ).json()
        assert answer["success"] is False and answer["data"]["data"] == []
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0
    assert (tmp_path / "run" / "monitor.db").is_file()  # the recorder opened the run's store
