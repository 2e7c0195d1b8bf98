"""A single-process AReaL ``TrainEngine`` for the embedded default and debugging.

AReaL's ``FSDPEngine`` needs a distributed launch and a GPU; the embedded default runs on two
CPU cores. This engine implements the part of ``TrainEngine`` that AReaL's own ``PPOActor``
drives (``forward`` for log-probs, ``train_batch`` with AReaL's loss functions, versions,
save/load), one sequence at a time with a plain torch optimizer, so advantages, the GRPO loss
and the PPO update are AReaL's code, not a re-implementation.

Sequences are processed one by one (no packing): each row of a padded batch is cut to its
length, run through the model with its own ``multi_modal_input``, and handed to the loss
function in AReaL's packed layout for a single sequence (1-D tensors plus ``cu_seqlens``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from areal.api.engine_api import InferenceEngine, TrainEngine
from areal.api.io_struct import SaveLoadMeta, WeightUpdateMeta
from areal.utils import stats_tracker
from areal.utils.data import concat_padded_tensors
from areal.utils.functional import gather_logprobs_entropy
from transformers import PreTrainedModel

PER_TOKEN_KEYS = frozenset(
    {
        "input_ids",
        "attention_mask",
        "loss_mask",
        "logprobs",
        "prox_logp",
        "ref_logp",
        "advantages",
        "returns",
        "values",
        "versions",
        "mm_token_type_ids",
        "kl_rewards",
        "tot_rewards",
    }
)
"""Keys whose tensors have a sequence dimension and are cut to each row's length."""


class LocalTrainEngine(TrainEngine):
    """Trains a Hugging Face causal (VL) model in this process, on CPU or one GPU."""

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
        temperature: float = 1.0,
        device: str | torch.device = "cpu",
        processor: Any = None,
        optimizer: str = "adam",
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        """``optimizer``: AReaL's ``OptimizerConfig.type`` — ``adam`` (AdamW with ``betas``,
        ``eps``) or ``sgd`` (plain SGD: a step moves each weight in proportion to its gradient,
        where Adam's first steps move every weight by about ``lr`` whatever its gradient)."""
        self.device = torch.device(device)
        # transformers wraps `to` in functools.wraps, which mypy reads as an unbound function.
        self.model = model.to(self.device)  # type: ignore[arg-type]
        self.temperature = temperature
        self.grad_clip = grad_clip
        self.processor = processor
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer: torch.optim.Optimizer
        if optimizer == "sgd":
            self.optimizer = torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
        elif optimizer in ("adam", "adam_bf16"):
            self.optimizer = torch.optim.AdamW(
                params, lr=lr, weight_decay=weight_decay, betas=betas, eps=eps
            )
        else:
            raise ValueError(f"optimizer type {optimizer!r}: expected 'adam' or 'sgd'")
        self._version = 0
        self._inference: InferenceEngine | None = None
        self._initialized = True
        self._lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None

    def schedule_lr(
        self,
        kind: str,
        total_steps: int,
        *,
        warmup_proportion: float = 0.0,
        min_lr_ratio: float = 0.0,
    ) -> None:
        """Anneal the learning rate over ``total_steps`` optimizer steps with AReaL's own
        schedules (``OptimizerConfig.lr_scheduler_type``: ``constant`` | ``linear`` |
        ``cosine``, after ``int(warmup_proportion * total_steps)`` warm-up steps), with the
        functions AReaL's FSDP engine uses; ``lr_scheduler_step`` advances it."""
        from areal.engine.fsdp_utils import get_cosine_schedule_with_warmup
        from transformers import (
            get_constant_schedule_with_warmup,
            get_linear_schedule_with_warmup,
        )

        warmup = int(warmup_proportion * total_steps)
        if kind == "cosine":
            self._lr_scheduler = get_cosine_schedule_with_warmup(
                self.optimizer, warmup, total_steps, min_lr_ratio=min_lr_ratio
            )
        elif kind == "linear":
            self._lr_scheduler = get_linear_schedule_with_warmup(
                self.optimizer, warmup, total_steps
            )
        elif kind == "constant":
            self._lr_scheduler = get_constant_schedule_with_warmup(self.optimizer, warmup)
        else:
            raise ValueError(f"lr_scheduler_type {kind!r}: expected constant, linear or cosine")

    # ------------------------------------------------------------------ single process
    def create_process_group(self, parallel_strategy: Any = None) -> None:
        """Nothing to create: one process, no parallelism."""

    def initialize(self, *args: Any, **kwargs: Any) -> None:
        self._initialized = True

    @property
    def data_parallel_group(self) -> dist.ProcessGroup | None:
        return None

    @property
    def data_parallel_rank(self) -> int:
        return 0

    @property
    def data_parallel_world_size(self) -> int:
        return 1

    def current_data_parallel_head(self) -> int:
        return 0

    def is_data_parallel_head(self) -> bool:
        return True

    @property
    def context_and_model_parallel_group(self) -> dist.ProcessGroup | None:
        return None

    @property
    def cpu_group(self) -> dist.ProcessGroup | None:
        return None

    @property
    def initialized(self) -> bool:
        return self._initialized

    def destroy(self) -> None:
        self._initialized = False

    def onload(self) -> None:
        """The model always stays where it is."""

    def offload(self) -> None:
        """The model always stays where it is."""

    def get_device_stats(self) -> Any:
        from areal.api.io_struct import DeviceRuntimeInfo

        return DeviceRuntimeInfo.get_current()

    # ------------------------------------------------------------------ modes and versions
    def train(self, mode: bool = True) -> LocalTrainEngine:
        self.model.train(mode)
        return self

    def set_version(self, version: int) -> None:
        self._version = version

    def get_version(self) -> int:
        return self._version

    def export_stats(self) -> dict[str, float]:
        stats: dict[str, float] = stats_tracker.export_all()
        return stats

    # ------------------------------------------------------------------ weights
    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def connect_engine(self, engine: InferenceEngine, meta: WeightUpdateMeta) -> None:
        self._inference = engine

    def update_weights(self, meta: WeightUpdateMeta) -> None:
        """``disk``: write a checkpoint to ``meta.path`` for the inference side to load.

        In-process inference engines are updated from memory by the training loop instead
        (``InProcessEngine.update_weights_from_state_dict``), which needs no disk round trip.
        """
        if meta.type != "disk" or not meta.path:
            raise ValueError(
                f"LocalTrainEngine can only publish weights to disk (got type={meta.type!r}, "
                f"path={meta.path!r}); in-process engines are updated from memory."
            )
        self.model.save_pretrained(meta.path)
        if self.processor is not None:
            self.processor.save_pretrained(meta.path)

    def save(self, meta: SaveLoadMeta) -> None:
        path = Path(meta.path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        processor = meta.processor or self.processor
        if processor is not None:
            processor.save_pretrained(path)
        elif meta.tokenizer is not None:
            meta.tokenizer.save_pretrained(path)
        state: dict[str, Any] = {"version": self._version}
        if meta.with_optim:
            state["optimizer"] = self.optimizer.state_dict()
        torch.save(state, path / "trainer_state.pt")

    def load(self, meta: SaveLoadMeta) -> None:
        from transformers import AutoModelForImageTextToText

        path = Path(meta.path)
        loaded = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
        self.model.load_state_dict(loaded.state_dict())
        state_file = path / "trainer_state.pt"
        if state_file.exists():
            state = torch.load(state_file, weights_only=False)
            self._version = int(state.get("version", 0))
            if meta.with_optim and "optimizer" in state:
                self.optimizer.load_state_dict(state["optimizer"])

    # ------------------------------------------------------------------ optimisation
    def optimizer_zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def optimizer_step(self) -> dict[str, float]:
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        finite = bool(torch.isfinite(grad_norm))
        if finite:
            self.optimizer.step()
        return {
            "update_successful": float(finite),
            "grad_norm": float(grad_norm),
            "lr": float(self.optimizer.param_groups[0]["lr"]),
        }

    def lr_scheduler_step(self) -> None:
        """Advance the schedule set by ``schedule_lr`` (none: the rate stays constant)."""
        if self._lr_scheduler is not None:
            self._lr_scheduler.step()

    # ------------------------------------------------------------------ forward passes
    def _rows(self, batch: dict[str, Any]) -> list[dict[str, Any]]:
        """Cut a padded batch into one unpadded dict per sequence (AReaL's packed layout)."""
        lengths = batch["attention_mask"].sum(-1).tolist()
        mm = batch.get("multi_modal_input")
        rows: list[dict[str, Any]] = []
        for i, length in enumerate(int(n) for n in lengths):
            row: dict[str, Any] = {}
            for key, value in batch.items():
                if key == "multi_modal_input":
                    continue
                if isinstance(value, torch.Tensor) and value.ndim >= 2 and key in PER_TOKEN_KEYS:
                    row[key] = value[i, :length]
                elif isinstance(value, torch.Tensor) and value.ndim >= 1:
                    row[key] = value[i]
                else:
                    row[key] = value
            row["cu_seqlens"] = torch.tensor([0, length], dtype=torch.int32)
            row["max_seqlen"] = length
            row["multi_modal_input"] = mm[i] if mm is not None else {}
            rows.append(row)
        return rows

    def _logits(
        self, row: dict[str, Any], *, every_position: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The row's next-token logits where they are read, and those positions (on the
        engine's device).

        A row with a ``loss_mask`` needs only the positions around its trained tokens
        (``_read_positions``); the model's head runs on those alone (``logits_to_keep``), a
        few dozen of a thousand-token prompt. Returns ``(logits [K, vocab], positions [K])``,
        or every position and ``None`` for a row without a mask or with ``every_position``."""
        ids = row["input_ids"].to(self.device).unsqueeze(0)
        kwargs: dict[str, Any] = {}
        for key, value in (row.get("multi_modal_input") or {}).items():
            if isinstance(value, torch.Tensor):
                kwargs[key] = value.to(self.device)
        if "mm_token_type_ids" in row and "pixel_values" in kwargs:
            kwargs["mm_token_type_ids"] = row["mm_token_type_ids"].to(self.device).unsqueeze(0)
        keep = None if every_position else _read_positions(row)
        if keep is not None:
            keep = kwargs["logits_to_keep"] = keep.to(self.device)
        out = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
        logits: torch.Tensor = out.logits[0].float()
        return logits, keep

    def _logprobs_entropy(
        self, row: dict[str, Any], logits: torch.Tensor, keep: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-position log-prob of the next token and entropy, over the whole row (0 where
        the logits were not computed: no loss reads those positions)."""
        labels = torch.roll(row["input_ids"].to(self.device), shifts=-1, dims=-1)
        if keep is None:
            pair: tuple[torch.Tensor, torch.Tensor] = gather_logprobs_entropy(
                logits, labels, temperature=self.temperature
            )
            return pair
        kept_logp, kept_entropy = gather_logprobs_entropy(
            logits, labels[keep], temperature=self.temperature
        )
        return _spread(kept_logp, keep, labels.shape[0]), _spread(
            kept_entropy, keep, labels.shape[0]
        )

    @torch.no_grad()
    def forward_batch(
        self,
        input_: list[dict[str, Any]] | dict[str, Any],
        output_seqlens: list[int] | None = None,
        aggregate_fn: Callable[[list[torch.Tensor]], torch.Tensor] = torch.cat,
    ) -> torch.Tensor:
        """Per-token log-probs of each sequence's next token, padded like the input."""
        batch = concat_padded_tensors(input_) if isinstance(input_, list) else input_
        out = torch.zeros(batch["attention_mask"].shape, dtype=torch.float32)
        for i, row in enumerate(self._rows(batch)):
            logprobs, _ = self._logprobs_entropy(row, *self._logits(row))
            out[i, : logprobs.shape[0]] = logprobs.cpu()
        return out

    def forward_backward_batch(
        self,
        mb_list: Any,
        process_output_fn: Callable[[torch.Tensor, dict[str, Any]], torch.Tensor | None],
        forward_only: bool = False,
    ) -> None:
        for mb in mb_list:
            for row in self._rows(mb):
                with torch.set_grad_enabled(not forward_only):
                    # a caller-supplied output function reads logits at every position
                    loss = process_output_fn(self._logits(row, every_position=True)[0], row)
                if not forward_only and loss is not None:
                    loss.backward()

    def _loss_of(
        self,
        row: dict[str, Any],
        loss_fn: Callable[..., torch.Tensor],
        weight: torch.Tensor,
        total_weight: torch.Tensor,
    ) -> torch.Tensor:
        logits, keep = self._logits(row)
        logprobs, entropy = self._logprobs_entropy(row, logits, keep)
        length = logprobs.shape[0]
        vocab_min = logits.detach().min(-1).values
        vocab_max = logits.detach().max(-1).values
        if keep is not None:
            vocab_min, vocab_max = (
                _spread(vocab_min, keep, length),
                _spread(vocab_max, keep, length),
            )
        loss = loss_fn(
            logprobs,
            entropy,
            {k: (v.to(self.device) if isinstance(v, torch.Tensor) else v) for k, v in row.items()},
            vocab_min_logits=vocab_min,
            vocab_max_logits=vocab_max,
        )
        return loss * (weight / total_weight)

    def train_batch(
        self,
        input_: list[dict[str, Any]] | dict[str, Any],
        loss_fn: Callable[..., torch.Tensor],
        loss_weight_fn: Callable[[dict[str, Any]], torch.Tensor],
    ) -> dict[str, float]:
        batch = concat_padded_tensors(input_) if isinstance(input_, list) else input_
        rows = self._rows(batch)
        weights = [torch.as_tensor(loss_weight_fn(row), dtype=torch.float32) for row in rows]
        total = torch.stack(weights).sum()
        self.optimizer_zero_grad()
        if float(total) == 0.0:
            return {"update_successful": 0.0, "grad_norm": 0.0, "lr": self._lr()}
        for row, weight in zip(rows, weights, strict=True):
            if float(weight) == 0.0:
                continue
            self._loss_of(row, loss_fn, weight, total).backward()
        return self.optimizer_step()

    @torch.no_grad()
    def eval_batch(
        self,
        input_: list[dict[str, Any]] | dict[str, Any],
        loss_fn: Callable[..., torch.Tensor],
        loss_weight_fn: Callable[[dict[str, Any]], torch.Tensor],
    ) -> torch.Tensor | None:
        batch = concat_padded_tensors(input_) if isinstance(input_, list) else input_
        rows = self._rows(batch)
        weights = [torch.as_tensor(loss_weight_fn(row), dtype=torch.float32) for row in rows]
        total = torch.stack(weights).sum()
        if float(total) == 0.0:
            return None
        losses = [
            self._loss_of(row, loss_fn, weight, total)
            for row, weight in zip(rows, weights, strict=True)
            if float(weight) > 0
        ]
        return torch.stack(losses).sum()

    def _lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # ------------------------------------------------------------------ rollouts
    def rollout_batch(
        self,
        data: list[dict[str, Any]],
        workflow: Any,
        workflow_kwargs: dict[str, Any] | None = None,
        group_size: int = 1,
    ) -> list[dict[str, Any]]:
        """Run ``workflow.arun_episode`` on the connected inference engine for every item (AReaL's
        ``TrainEngine`` interface; blocking, like AReaL's).
        """
        return asyncio.run(self.arollout_batch(data, workflow, group_size))

    async def arollout_batch(
        self, data: list[dict[str, Any]], workflow: Any, group_size: int = 1
    ) -> list[dict[str, Any]]:
        """``group_size`` is AReaL's (rollouts per item) and must stay 1: the CUA workflow runs
        ``cua.agent.group_size`` episodes per task itself, the one group size of a run."""
        if group_size != 1:
            raise ValueError(
                f"group_size {group_size}: AReaL's rollouts per item stay 1; the group size is "
                "cua.agent.group_size (the workflow runs the group)"
            )
        if self._inference is None:
            raise RuntimeError("connect_engine() an inference engine before collecting rollouts")
        jobs = [workflow.arun_episode(self._inference, item) for item in data]
        results = await asyncio.gather(*jobs)
        return [r for r in results if r is not None]

    def prepare_batch(
        self,
        dataloader: Any,
        workflow: Any,
        workflow_kwargs: dict[str, Any] | None = None,
        should_accept_fn: Callable[[dict[str, Any]], bool] | str | None = None,
        group_size: int = 1,
        dynamic_bs: bool = False,
    ) -> list[dict[str, Any]]:
        items = next(iter(dataloader))
        batch = self.rollout_batch(list(items), workflow, workflow_kwargs, group_size)
        if callable(should_accept_fn):
            batch = [b for b in batch if should_accept_fn(b)]
        return batch


def _read_positions(row: dict[str, Any]) -> torch.Tensor | None:
    """Positions whose next-token prediction a loss may read: ``t`` where ``loss_mask[t]`` or
    ``loss_mask[t + 1]``. AReaL's callers pass the mask both ways: as collected (log-prob
    recomputation, the SFT loss, which roll it themselves) and already rolled by
    ``compute_advantages`` (the PPO update). ``None`` (all) for a row without a mask or with
    an empty one."""
    mask = row.get("loss_mask")
    if not isinstance(mask, torch.Tensor):
        return None
    mask = mask.bool()
    keep = (mask | torch.roll(mask, shifts=-1, dims=-1)).nonzero().flatten()
    return keep if keep.numel() else None


def _spread(values: torch.Tensor, positions: torch.Tensor, length: int) -> torch.Tensor:
    """``values`` at ``positions`` of a zero vector of ``length`` (differentiable)."""
    out = values.new_zeros(length)
    return out.index_put((positions,), values)
