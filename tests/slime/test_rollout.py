"""The in-process route: slime's own rollout plumbing (vendored at the pinned commit, run
unchanged: ``RolloutDataSourceWithBuffer`` reading the prompt data, ``call_rollout_fn``,
``validate_rollout_id_annotated``) drives ``cua_native.slime.rollout.generate_rollout`` against
the stand-in SGLang server and the simulator, recording into the Training Monitor (SQLite).

Every sample is checked against what the server built and answered: the prompt ids SGLang's
expansion produced from the request, the output ids, log-probs and weight version of the
answer; the rewards against the loop's rule (episode rewards normalised within the group,
discounted by turn); the image tensors against the prompt's image pads.
"""

from __future__ import annotations

import math
import pickle
import sqlite3
from pathlib import Path
from typing import Any

from cua_native.rollout.trajectory import discounted, normalized_rewards
from cua_native.slime import rollout as cua_rollout


def test_slime_rollout_function_trains_on_exact_turn_samples(
    sglang: Any, args_for: Any, tasks_file: Path, tmp_path: Path
) -> None:
    from slime.observability.rollout_data_utils import validate_rollout_id_annotated
    from slime.rollout.base_types import RolloutFnTrainOutput, call_rollout_fn
    from slime.rollout.data_source import RolloutDataSourceWithBuffer
    from slime.utils.types import Sample

    run_dir = tmp_path / "run"
    args = args_for(sglang, run_dir, prompt_data=str(tasks_file))
    data_source = RolloutDataSourceWithBuffer(args)
    loop = cua_rollout.runtime(args)
    play = loop.workflow.play_group
    played: list[str] = []

    async def first_group_dropped(engine: Any, task: Any, data: dict[str, Any]) -> Any:
        played.append(task.task_id)
        return None if len(played) == 1 else await play(engine, task, data)

    loop.workflow.play_group = first_group_dropped  # type: ignore[method-assign]
    try:
        outputs = [
            call_rollout_fn(cua_rollout.generate_rollout, args, step, data_source, evaluation=False)
            for step in (0, 1)
        ]
        # slime ships args to its Ray actors: the loop's live objects stay behind
        assert getattr(pickle.loads(pickle.dumps(args)), cua_rollout.RUNTIME_ATTR) is None
    finally:
        cua_rollout.shutdown(args)

    # the dropped group was replaced by the data source's next prompt, once
    assert [o.metrics for o in outputs] == [{"cua/dropped_groups": 1}, {"cua/dropped_groups": 0}]
    assert len(played) == 3 + 2
    groups = []
    for output in outputs:
        assert isinstance(output, RolloutFnTrainOutput)
        validate_rollout_id_annotated(output.samples)  # slime's check of prompt x rollout x samples
        assert len(output.samples) == args.rollout_batch_size
        assert all(len(group) == args.n_samples_per_prompt for group in output.samples)
        groups.extend(output.samples)
    assert [g[0][0].group_index for g in groups] == [1, 2, 3, 4]  # group 0 was dropped

    calls = {tuple(c.response.output_tokens): c for c in sglang.calls}
    pad = sglang.served.engine.processor.image_token_id
    merge = sglang.served.engine.processor.image_processor.merge_size
    episodes = [episode for group in groups for episode in group]
    assert len({e[0].rollout_id for e in episodes}) == len(episodes)
    for group in groups:
        raw = [episode[0].metadata["raw_reward"] for episode in group]
        want = [
            discounted(a, len(e), 0.9)
            for a, e in zip(normalized_rewards(raw, 1e-6), group, strict=True)
        ]
        for episode, rewards in zip(group, want, strict=True):
            assert [s.reward for s in episode] == rewards
            assert len(episode) == episode[0].metadata["cua_turns"] >= 1
            for turn, sample in enumerate(episode):
                assert isinstance(sample, Sample)
                assert sample.rollout_id == sample.index == episode[0].index
                assert sample.metadata["cua_turn"] == turn
                call = calls[tuple(sample.tokens[-sample.response_length :])]
                n = sample.response_length
                assert n == len(call.response.output_tokens) > 0
                assert sample.tokens == call.built + call.response.output_tokens
                assert sample.loss_mask == [1] * n
                assert sample.rollout_log_probs == [float(x) for x in call.response.output_logprobs]
                assert sample.weight_versions == [str(call.version)]
                assert sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
                assert (sample.status == Sample.Status.TRUNCATED) == (
                    call.response.stop_reason == "length"
                )
                mm = sample.multimodal_train_inputs
                assert set(mm) == {"pixel_values", "image_grid_thw"}
                grid = mm["image_grid_thw"]
                assert mm["pixel_values"].shape[0] == int(grid.prod(dim=1).sum())
                assert call.built.count(pad) == int(grid.prod(dim=1).sum()) // merge**2
                # slime's own length checks on the response fields
                sample._validate_response_metadata_lengths()

    # the episodes are in the Training Monitor, with the rewards and turns the samples carry
    with sqlite3.connect(run_dir / "monitor.db") as db:
        rows = {
            r[0]: r[1:]
            for r in db.execute(
                "SELECT r.rollout_id, r.reward, r.num_turns, s.step FROM rollout r"
                " JOIN step s ON r.step_id = s.id"
            )
        }
    assert len(rows) == len(episodes) == 8
    for index, episode in enumerate(episodes):
        reward, turns, step = rows[episode[0].metadata["cua_episode_id"]]
        assert math.isclose(reward, episode[0].metadata["raw_reward"])
        assert turns == len(episode)
        assert step == index // 4  # rollout_id 0, then 1
