"""A DeepSpeed engine over a tiny policy, for steps under test."""

from __future__ import annotations

from pathlib import Path

import torch

from asearcher.trainer.runtime.deepspeed_setup import deepspeed_config, initialize


def engine_for(model_dir: Path, stage: int, lr: float = 3e-3):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = deepspeed_config(
        {"zero_optimization": {"stage": stage}, "optimizer": {"params": {"lr": lr}}}
    )
    return initialize(model, config)
