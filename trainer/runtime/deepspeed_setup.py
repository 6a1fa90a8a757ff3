"""DeepSpeed for the trainer: the default config, the user's overrides, one-process set-up.

On a machine without GPUs DeepSpeed runs with its CPU accelerator (`DS_ACCELERATOR=cpu`, set
here before DeepSpeed is imported) and the gloo backend; ZeRO stages 0-3 all work there. A single
process needs the torch.distributed variables, which are filled in when the launcher did not.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

import torch

from asearcher.streams.cluster.local_broker import free_port

# The trainer takes one optimiser step per batch of GRPO groups, whatever the number of
# micro-batches it packs them into, so accumulation is driven by the trainer (see step.py).
DEFAULT_DEEPSPEED: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 0},
    "optimizer": {
        "type": "AdamW",
        "params": {
            "lr": 1e-5,
            "betas": [0.9, 0.999],
            "eps": 1e-8,
            "weight_decay": 0.0,
            "torch_adam": True,
        },
    },  # fmt: skip
    "bf16": {"enabled": False},
    "fp16": {"enabled": False},
    "steps_per_print": 1_000_000_000,
    "wall_clock_breakdown": False,
}


def merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` applied recursively (tables merge, values replace)."""
    result = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def deepspeed_config(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The DeepSpeed config the trainer runs with."""
    return merged(DEFAULT_DEEPSPEED, overrides or {})


def prepare_environment() -> None:
    """Pick the CPU accelerator without GPUs and fill in a one-process world if unlaunched."""
    # DeepSpeed's JIT-built ops are compiled against this environment's paths: environments
    # sharing torch's default cache would rebuild them for one another (minutes each time).
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "RANK" not in os.environ:
        os.environ.update(
            {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
        )
        os.environ.setdefault("MASTER_PORT", str(free_port()))


def ensure_distributed() -> None:
    """Join the process group the launcher described (or a one-process one)."""
    prepare_environment()
    import deepspeed

    if not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        deepspeed.init_distributed(dist_backend=backend, verbose=False)


def initialize(model: torch.nn.Module, config: dict[str, Any]) -> Any:
    """`deepspeed.initialize` over `model` with `config` (every rank); returns the engine."""
    ensure_distributed()
    import deepspeed

    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=config,
    )  # fmt: skip
    return engine


def full_state_dict(engine: Any) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, gathered from ZeRO-3 partitions when needed, on CPU."""
    if engine.zero_optimization_stage() == 3:
        state = engine._zero3_consolidated_16bit_state_dict()  # noqa: SLF001 - DeepSpeed's API
    else:
        state = engine.module.state_dict()
    return {name: tensor.detach().to("cpu") for name, tensor in state.items()}
