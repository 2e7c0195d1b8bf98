"""Copy new weights into a live model (worker thread only) and read checkpoints from disk."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from transformers import PreTrainedModel

NamedTensors = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]


def _items(tensors: NamedTensors) -> list[tuple[str, torch.Tensor]]:
    return list(tensors.items()) if isinstance(tensors, Mapping) else list(tensors)


def check_named_tensors(
    model: PreTrainedModel, tensors: NamedTensors
) -> list[tuple[str, torch.Tensor]]:
    """Validate names and shapes against ``model`` before anything is copied.

    A partial update (a subset of parameters) is allowed; unknown names or wrong shapes raise
    ``ValueError`` and leave the model untouched.
    """
    items = _items(tensors)
    if not items:
        raise ValueError("weight update holds no tensors.")
    own = model.state_dict(keep_vars=True)
    unknown = [name for name, _ in items if name not in own]
    if unknown:
        raise ValueError(f"weight update names unknown to the model: {unknown[:5]}")
    for name, tensor in items:
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise ValueError(
                f"weight {name!r} has shape {tuple(tensor.shape)}, model has {tuple(own[name].shape)}"
            )
    return items


@torch.no_grad()
def copy_into(model: torch.nn.Module, items: list[tuple[str, torch.Tensor]]) -> int:
    """Copy checked tensors into the model in place (dtype/device converted); returns the count."""
    own = model.state_dict(keep_vars=True)
    for name, tensor in items:
        own[name].data.copy_(tensor.to(device=own[name].device, dtype=own[name].dtype))
    return len(items)


def load_checkpoint_state(model: PreTrainedModel, path: str | Path) -> dict[str, torch.Tensor]:
    """Read a ``save_pretrained`` directory into a state dict with ``model``'s parameter names.

    Loading through ``type(model).from_pretrained`` applies the same key conversions as the
    original load, so checkpoints written by any transformers version map onto the live model.
    Runs on CPU; call it off the event loop.
    """
    directory = Path(path)
    if not directory.is_dir() or not (directory / "config.json").exists():
        raise FileNotFoundError(f"{directory} is not a Hugging Face model directory.")
    first = next(iter(model.parameters()))
    loaded = type(model).from_pretrained(directory, dtype=first.dtype, device_map="cpu")
    try:
        return {k: v.detach() for k, v in loaded.state_dict().items()}
    finally:
        del loaded
