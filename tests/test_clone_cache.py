"""A warm start's clone is made once per machine (`warm_start.keep_clone`): a later run with the
same policy, demonstrations and settings announces the kept clone instead of cloning again,
and a change to what makes the clone clones afresh."""

from __future__ import annotations

import re
import tomllib
import uuid
from pathlib import Path

import msgspec
import pytest

from asearcher.cli.run.clone_cache import clone_key, clones_dir
from asearcher.cli.run.config import Paths, Resolved, RunConfig, paths, resolve
from asearcher.cli.run.topology import prepare
from asearcher.cli.run.warm_start import cloning_config, warm_start
from asearcher.streams.storage.weight_reader import WeightStoreReader
from asearcher.streams.wire.events import TrajectoryFinished
from asearcher.trainer.sft.sft_job import TrainingSet

SMALL_RUN = """
[policy]
vocab_size = 512
hidden_size = 64
layers = 1
pretrain_steps = 2
[data]
world_entities = 30
world_questions = 60
world_max_hops = 1
world_filler = false
dense = false
[tools.config]
search_mode = "bm25"
top_k = 2
doc_chars = 200
chunk_chars = 1500
max_chunks = 1
[rollout.config.agent]
turns = "single_call"
brief_prompt = true
short_observations = true
[eval.config.sampling]
temperature = 0.6
max_new_tokens_per_turn = 16
max_turns = 2
seed = 1
[warm_start]
enabled = true
worlds = 1
borrow_names = true
questions = 12
epochs = 1
batch = 4
orders = 2
selection_questions = 2
keep_clone = true
"""


def _prepared(name: str, home: Path, **warm: object) -> tuple[RunConfig, Paths, Resolved]:
    """The small run named `name` in a new `home`, its topics and world made, its data resolved."""
    raw = tomllib.loads(SMALL_RUN)
    raw["name"] = name
    raw["warm_start"].update(warm)
    config = msgspec.convert(raw, RunConfig)
    home.mkdir(parents=True)
    where = paths(config, home)
    prepare(config, where)
    return config, where, resolve(config, where)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_later_run_announces_the_clone_an_earlier_one_kept(
    settings, codec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("ASEARCHER_CACHE", str(tmp_path / "cache"))
    tag = uuid.uuid4().hex[:6]

    def start(name: str, home: Path, **warm: object) -> tuple[bytes, dict, str]:
        config, where, resolved = _prepared(f"{name}{tag}", home, **warm)
        published = warm_start(config, resolved, where, settings, codec)
        assert published is not None and published.version == 1
        store = WeightStoreReader(where.store)
        weights = store.read_file(1, "model.safetensors")
        out = capsys.readouterr().out.replace("\n", " ")
        return weights, store.get(1).manifest.recipe, out

    first_weights, first_recipe, out = start("a", tmp_path / "a")
    assert "cloned before on this machine" not in out and "order 2 (shuffle seed" in out
    assert len(list(clones_dir().iterdir())) == 1  # kept, no partial copy left

    # Another run, in another home, with its own demonstrations of the same questions: the
    # same inputs, so the kept clone is announced, with the recipe of the first.
    second_weights, second_recipe, out = start("b", tmp_path / "b")
    assert "cloned before on this machine, copied from" in out
    assert "order 1 (shuffle seed" not in out  # nothing cloned or scored again
    assert second_weights == first_weights
    assert (
        second_recipe["run"] == f"b{tag}"
        and second_recipe["selection"] == first_recipe["selection"]
    )
    for field in ("seed", "steps", "first_loss", "last_loss", "trajectories", "snapshot_step"):
        assert second_recipe[field] == first_recipe[field]

    # A setting that makes the clone otherwise makes a new one, kept beside the first.
    third_weights, third_recipe, out = start("c", tmp_path / "c", epochs=2)
    assert "cloned before on this machine" not in out
    assert third_recipe["steps"] == 2 * first_recipe["steps"] and third_weights != first_weights
    assert len(list(clones_dir().iterdir())) == 2


def test_the_key_follows_the_demonstrations_content_not_their_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASEARCHER_CACHE", str(tmp_path / "cache"))
    config, where, resolved = _prepared("k", tmp_path / "home")
    cloning = cloning_config(config, model="k", seed=1)
    one = TrajectoryFinished(
        trajectory_id="t1", group_id="g1", question_id="q1", token_ids=[5, 6, 7],
        logprobs=[0.0] * 3, loss_mask=[0, 1, 1], token_versions=[0] * 3, reward=1.0,
    )  # fmt: skip

    def key(trajectory: TrajectoryFinished, **changes: object) -> str:
        sft = msgspec.structs.replace(cloning, **changes)
        return clone_key(config, resolved, where, sft, TrainingSet([trajectory]))

    base = key(one)
    assert key(msgspec.structs.replace(one, trajectory_id="t2", group_id="g2")) == base
    assert key(one, run="another", model="another") == base  # the run's name
    assert key(msgspec.structs.replace(one, token_ids=[5, 6, 8])) != base
    assert key(msgspec.structs.replace(one, reward=0.5)) != base
    assert key(one, lr=1e-3) != base
    assert key(one, seed=2) != base
    (where.model_dir / "config.json").write_text("{}")
    assert key(one) != base  # another policy


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_warm_start_cut_while_cloning_keeps_the_orders_it_scored(
    settings, codec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    import asearcher.cli.jobs.cloning as cloning

    monkeypatch.setenv("ASEARCHER_CACHE", str(tmp_path / "cache"))
    config, where, resolved = _prepared(f"cut{uuid.uuid4().hex[:6]}", tmp_path / "home")
    train, cloned = cloning.train_with_progress, []

    def cut_at(order: int):
        def counted(job, data, label, *args, **kwargs):
            cloned.append(label)
            if len(cloned) == order:
                raise RuntimeError("cut")  # as Ctrl-C would, while this order clones
            return train(job, data, label, *args, **kwargs)

        return counted

    monkeypatch.setattr(cloning, "train_with_progress", cut_at(2))
    with pytest.raises(RuntimeError, match="cut"):
        warm_start(config, resolved, where, settings, codec)
    first = " ".join(capsys.readouterr().out.split())  # as printed, unwrapped
    scored = re.search(r"order 1 \(shuffle seed (\d+)\): F1 ([\d.]+)", first)
    assert scored is not None
    assert [p.name.split("-")[-1] for p in clones_dir().iterdir()] == [f"order{scored[1]}"]

    cloned.clear()
    monkeypatch.setattr(cloning, "train_with_progress", cut_at(0))  # never cut
    published = warm_start(config, resolved, where, settings, codec)
    again = " ".join(capsys.readouterr().out.split())
    assert published is not None and published.version == 1
    assert cloned == ["warm start (sft, order 2/2)"]  # the first order is not cloned again
    assert (
        f"order 1 (shuffle seed {scored[1]}): kept by a warm start that was cut, F1 {scored[2]}"
        in again
    )
    assert "order 2 (shuffle seed" in again
    kept = [p.name for p in clones_dir().iterdir()]
    assert len(kept) == 1 and "order" not in kept[0]  # the clone, its orders dropped
