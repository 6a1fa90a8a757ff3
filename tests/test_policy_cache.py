"""A policy made once on a machine is copied, not pretrained again, by every later run that
needs the same one; anything that changes the policy makes a new one."""

from __future__ import annotations

from pathlib import Path

import pytest

from asearcher.cli.run.policy_cache import policies_dir, policy_key
from asearcher.cli.run.prepare import policy
from asearcher.consumers.world.world import generate_world, write_world
from asearcher.producers.policy.model_init import PolicySpec, read_pretraining

SPEC = PolicySpec(vocab_size=1024, hidden_size=64, layers=1, pretrain_steps=3)


@pytest.fixture
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ASEARCHER_CACHE", str(tmp_path / "cache"))
    write_world(generate_world(0, entities=60, questions=20, filler=False), tmp_path / "world")
    return tmp_path / "world" / "corpus.jsonl"


def test_a_second_run_copies_the_policy_the_first_made(
    tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = policy(tmp_path / "home1" / "policy", corpus, 1, SPEC)
    assert "made before on this machine" not in capsys.readouterr().out
    kept = policies_dir() / policy_key(corpus, 1, SPEC)
    assert sorted(p.name for p in kept.iterdir()) == sorted(p.name for p in first.iterdir())

    second = policy(tmp_path / "home2" / "policy", corpus, 1, SPEC)
    assert f"copied from {kept}" in capsys.readouterr().out.replace("\n", "")
    for name in ("model.safetensors", "tokenizer.json", "pretraining.json"):
        assert (second / name).read_bytes() == (first / name).read_bytes()
    assert read_pretraining(second) == read_pretraining(first)
    assert [p.name for p in policies_dir().iterdir()] == [kept.name]  # no partial copy left


def test_what_makes_the_policy_makes_its_key(tmp_path: Path, corpus: Path) -> None:
    key = policy_key(corpus, 1, SPEC)
    assert policy_key(corpus, 1, SPEC) == key
    assert policy_key(corpus, 2, SPEC) != key
    assert policy_key(corpus, 1, PolicySpec(vocab_size=1024, hidden_size=64, layers=2)) != key
    other = tmp_path / "other.jsonl"
    other.write_bytes(corpus.read_bytes().replace(b"a", b"b", 1))
    assert policy_key(other, 1, SPEC) != key


def test_a_cache_it_cannot_write_leaves_the_run_its_policy(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    monkeypatch.setenv("ASEARCHER_CACHE", str(blocked))
    made = policy(tmp_path / "home" / "policy", corpus, 1, SPEC)
    assert (made / "model.safetensors").is_file()
    assert "the policy was not kept for later runs" in caplog.text
