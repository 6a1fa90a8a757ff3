"""What two ways of cutting a training pass's work save, side by side: the output layer at the
trained positions alone, and one sequence per micro-batch instead of several padded together.

A step of the CPU policy's pretraining labels a repeated span of ~16 tokens in sequences of up
to ~700, and a cloning or RL step trains the tokens the policy wrote, a share of a trajectory
whose prompt and observations are the rest; the vocabulary's logits and softmax at every other
position are work no loss reads. Both ways are timed here on the same batches, alternately:

1. Pretraining: the learning run's policy shape (`infra/recipes/cpu-learn.toml`), copy batches
   with leads of 0, 200 and 400 tokens of text (the lead rises to 400 by the last step),
   transformers' causal LM loss against `pretrain.labelled_loss`, forward and backward.
2. Cloning: the demonstrations of a home where `asearcher learn` has run (its broker's
   `expert.trajectories`, as the warm start reads them) in the warm start's batches of 8,
   micro-batched as a step does, `token_logprobs` over every position against
   `trained_only=True`, forward and backward, packed into micro-batches of the run's
   `micro_batch_tokens`; and the latter again with a sequence per micro-batch. Padded rows
   cost their padding and an explicit attention mask, which takes SDPA off its causal path
   (every block of the square computed); a row alone needs no mask.

`ASEARCHER_BENCH_HOME=<home> .venv/bin/python -m pytest tests/benchmarks/bench_training_passes.py
-m benchmark -s` (about 3 minutes on 2 cores; it starts that home's broker: `asearcher stream
down --home <home>` afterwards). Results: results/training-passes.json.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from harness import show_table, write_results

from tests.support.runs import ASEARCHER

if TYPE_CHECKING:
    from asearcher.cli.run.config import RunConfig
    from asearcher.producers.policy.model_init import PolicySpec

pytestmark = pytest.mark.benchmark

HOME = os.environ.get("ASEARCHER_BENCH_HOME", "")
REPEATS = 4  # timed passes of each way per batch, alternating
LEADS = (0, 200, 400)
CLONING_BATCHES = 12
RUN = "learn"


def timed(work: Callable[[], torch.Tensor]) -> float:
    started = time.perf_counter()
    work().backward()
    return time.perf_counter() - started


def side_by_side(ways: dict[str, Callable[[], torch.Tensor]], model: torch.nn.Module) -> dict:
    """Median seconds of a forward and backward pass each way, alternating, after a warm-up."""
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for work in ways.values():
        timed(work)
        model.zero_grad(set_to_none=True)
    for _ in range(REPEATS):
        for name, work in ways.items():
            seconds[name].append(timed(work))
            model.zero_grad(set_to_none=True)
    return {name: statistics.median(values) for name, values in seconds.items()}


def pretraining_rows(spec: PolicySpec) -> list[dict[str, Any]]:
    from asearcher.producers.policy.model_init import build_model
    from asearcher.producers.policy.pretrain import BATCH, copy_batch, labelled_loss

    model = build_model(
        spec.vocab_size, 1, hidden_size=spec.hidden_size, layers=spec.layers, heads=spec.heads,
        kv_heads=spec.kv_heads, intermediate_size=spec.intermediate_size, max_positions=4096,
        seed=0,
    ).train()  # fmt: skip
    rng = random.Random(0)
    corpus = [rng.randrange(257, spec.vocab_size) for _ in range(50_000)]
    rows = []
    for lead in LEADS:
        tokens, labels = copy_batch(corpus, spec.vocab_size, rng, BATCH, 1, lead=lead)
        ids, targets = torch.tensor(tokens), torch.tensor(labels)
        medians = side_by_side({
            "every position": partial(_causal_lm_loss, model, ids, targets),
            "labelled only": partial(labelled_loss, model, ids, targets),
        }, model)  # fmt: skip
        share = float((targets != -100).float().mean())
        batch = f"lead {lead}, {ids.shape[1]} tokens a row"
        rows.append({"part": "pretraining", "batch": batch, "trained_share": share, **medians})
    return rows


def cloning_rows(home: Path, config: RunConfig) -> list[dict[str, Any]]:
    from transformers import AutoModelForCausalLM

    from asearcher.cli.run.config import paths
    from asearcher.cli.run.warm_start import cloning_config
    from asearcher.streams.cluster.settings import KafkaSettings, local_bootstrap
    from asearcher.streams.wire.codec import EventCodec
    from asearcher.trainer.policy.batching import pack_micro_batches
    from asearcher.trainer.policy.sequences import rows_batch, training_rows
    from asearcher.trainer.sft.sft_job import training_set

    where = paths(config, home)
    sft = cloning_config(config, model="bench", seed=0)
    settings = KafkaSettings(bootstrap_servers=local_bootstrap(home))
    model = AutoModelForCausalLM.from_pretrained(where.model_dir).train()
    data = training_set(settings, EventCodec(), sft, model.config.vocab_size).trajectories
    assert data, f"no demonstrations of run {RUN!r} on {home}'s broker"
    random.Random(0).shuffle(data)
    per_step = sft.trajectories_per_step
    rows = []
    for number in range(CLONING_BATCHES):
        trajectories = data[number * per_step : (number + 1) * per_step]
        batch_rows = training_rows(trajectories, [0.0] * len(trajectories))
        packs = pack_micro_batches([r.length for r in batch_rows], sft.micro_batch_tokens)
        batches = [rows_batch([batch_rows[i] for i in pack]) for pack in packs]
        alone = [rows_batch([row]) for row in batch_rows]

        medians = side_by_side({
            "every position": partial(_cloning_loss, model, batches, False),
            "labelled only": partial(_cloning_loss, model, batches, True),
            "a row alone": partial(_cloning_loss, model, alone, True),
        }, model)  # fmt: skip
        tokens = sum(b.tokens for b in batches)
        rows.append({"part": "cloning", "batch": f"{len(trajectories)} demos, {tokens} tokens",
                     "trained_share": sum(float(b.loss_mask.sum()) for b in batches) / tokens,
                     **medians})  # fmt: skip
    return rows


def _causal_lm_loss(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> Any:
    return model(ids, labels=labels).loss


def _cloning_loss(model: torch.nn.Module, batches: list, trained_only: bool) -> torch.Tensor:
    from asearcher.trainer.policy.sequences import token_logprobs

    losses = [-(token_logprobs(model, b, trained_only) * b.loss_mask).sum() for b in batches]
    return torch.stack(losses).sum()


@pytest.mark.timeout(1200)
def test_training_passes() -> None:
    from asearcher.cli.wiring import chosen_run_config

    assert HOME, "set ASEARCHER_BENCH_HOME to a home where `asearcher learn` has run"
    torch.manual_seed(0)
    subprocess.run([ASEARCHER, "stream", "up", "--broker-only", "--home", HOME], check=True)
    config = chosen_run_config(None, RUN, Path(HOME))
    rows = pretraining_rows(config.policy) + cloning_rows(Path(HOME), config)
    show_table(
        "a forward and backward pass with the output layer at every position, at the trained "
        f"ones alone, and so with a sequence per micro-batch (median of {REPEATS}, alternating)",
        ["part", "batch", "trained share", "every position s", "trained only s", "ratio",
         "a row alone s", "ratio"],
        [[r["part"], r["batch"], f"{r['trained_share']:.2f}", f"{r['every position']:.3f}",
          f"{r['labelled only']:.3f}", f"{r['labelled only'] / r['every position']:.2f}",
          *([f"{r['a row alone']:.3f}", f"{r['a row alone'] / r['every position']:.2f}"]
            if "a row alone" in r else ["-", "-"])]
         for r in rows],
    )  # fmt: skip
    summary = {}
    for part, way in (("pretraining", "labelled only"), ("cloning", "labelled only"),
                      ("cloning", "a row alone")):  # fmt: skip
        mine = [r for r in rows if r["part"] == part]
        ratio = sum(r[way] for r in mine) / sum(r["every position"] for r in mine)
        summary[f"{part}, {way}"] = ratio
        print(f"{part}, {way}: {ratio:.2f} of the time over every position")
    write_results("training-passes", {"home": HOME, "repeats": REPEATS, "ratios": summary,
                                      "rows": rows})  # fmt: skip
    assert all(r["labelled only"] > 0 for r in rows)
