"""Fitting a published state dict to a model, shared by the rollout engines and the trainer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class WeightLoadError(ValueError):
    """A published state dict does not fit the model (names, shapes or tied weights)."""


def fit_state_dict(
    model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """`tensors` completed with tied aliases and checked against `model`, before any copy.

    A tied weight (lm_head = embed_tokens) may be saved once: the alias is filled from the
    weight it shares storage with. If both are present they must be equal. Raises
    WeightLoadError on missing or unexpected names and on shape mismatches, so a bad state dict
    never half-overwrites the model.
    """
    import torch

    expected = model.state_dict()
    complete = dict(tensors)
    for alias, source in _tied_aliases(expected).items():
        if alias not in complete and source in complete:
            complete[alias] = complete[source]
        elif alias in complete and source in complete:
            if not torch.equal(complete[alias], complete[source]):
                raise WeightLoadError(f"{alias} is tied to {source} but the values differ")
    missing = sorted(expected.keys() - complete.keys())
    unexpected = sorted(complete.keys() - expected.keys())
    if missing or unexpected:
        raise WeightLoadError(
            f"state dict does not fit: missing {missing}, unexpected {unexpected}"
        )
    wrong = [n for n, t in expected.items() if tuple(complete[n].shape) != tuple(t.shape)]
    if wrong:
        raise WeightLoadError(f"shape mismatch for {wrong}")
    return complete


def _tied_aliases(state: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """Later names that share storage with an earlier one (tied weights), alias -> source."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, tensor in state.items():
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in first and tensor.numel() > 0:
            aliases[name] = first[pointer]
        else:
            first.setdefault(pointer, name)
    return aliases
