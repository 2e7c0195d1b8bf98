"""Token exactness on the full path: CUAAgentWorkflow + real InProcessEngine + tiny Qwen3-VL +
SimGym. Every returned row (every turn) is pushed through AReaL's batching and Qwen-VL position
code, then re-scored by a forward pass of the same model: the engine's logprobs must match."""

from __future__ import annotations

import torch
from areal.infra.workflow_executor import check_trajectory_format
from areal.utils.data import concat_batch
from transformers import AutoModelForImageTextToText

from cua_native.rollout.config import AgentConfig, SamplingConfig
from cua_native.rollout.workflow import CUAAgentWorkflow


async def test_every_turn_rescored_matches_engine(
    tiny_dir, processor, inprocess_engine, faulty_gym_factory
) -> None:
    config = AgentConfig(
        max_turns=2,
        group_size=2,
        max_consecutive_parse_errors=5,
        sampling=SamplingConfig(max_new_tokens=12, temperature=1.0),
    )
    gym = faulty_gym_factory()
    workflow = CUAAgentWorkflow(config, gym=gym, processor=processor)
    task = (await gym.list_tasks())[0]
    out = await workflow.arun_episode(inprocess_engine, {"task": task.model_dump_json()})
    assert out is not None and check_trajectory_format(out)
    rows = out["input_ids"].shape[0]
    assert rows >= 2  # at least one turn per episode
    assert gym.started == gym.closed == 2

    # AReaL's own batching of a group with another group, as the trainer does.
    batched, _ = concat_batch([out, out])
    assert batched["input_ids"].shape[0] == 2 * rows
    assert len(batched["multi_modal_input"]) == 2 * rows

    model = AutoModelForImageTextToText.from_pretrained(str(tiny_dir), dtype=torch.float32).eval()
    mm = out["multi_modal_input"]
    with torch.no_grad():
        for i in range(rows):
            length = int(out["attention_mask"][i].sum())
            ids = out["input_ids"][i : i + 1, :length]
            grid = mm[i]["image_grid_thw"]
            # The Qwen-VL 3D positions AReaL's FSDP engine computes from mm_token_type_ids.
            positions = model.model.compute_3d_position_ids(
                input_ids=ids,
                image_grid_thw=grid,
                video_grid_thw=None,
                attention_mask=torch.ones_like(ids),
                mm_token_type_ids=out["mm_token_type_ids"][i : i + 1, :length],
                inputs_embeds=None,
                past_key_values=None,
            )
            logits = (
                model(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    pixel_values=mm[i]["pixel_values"],
                    image_grid_thw=grid,
                    position_ids=positions,
                )
                .logits[0]
                .float()
            )
            mask = out["loss_mask"][i, :length].bool()
            positions_out = mask.nonzero().squeeze(-1)
            temperature = config.sampling.temperature or 1.0
            logp = torch.log_softmax(logits[positions_out - 1] / temperature, dim=-1)
            recomputed = logp.gather(-1, ids[0, positions_out].unsqueeze(-1)).squeeze(-1)
            engine_lp = out["logprobs"][i, :length][mask]
            assert torch.allclose(recomputed, engine_lp, atol=1e-4), (i, recomputed, engine_lp)
            assert (out["versions"][i, :length][mask] == inprocess_engine.get_version()).all()
