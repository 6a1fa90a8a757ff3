"""The `weights` topic is untrusted: announcements are believed only in the store's own chain,
tombstones wipe nothing, and with a key only versions the trainer signed are loaded."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import msgspec
import pytest
import torch

from asearcher.producers.rollout.weights_follower import WeightsFollower
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.storage.weight_reader import (
    ENV_WEIGHTS_KEY,
    ENV_WEIGHTS_KEY_FILE,
    SIGNATURE,
    PublishedVersion,
    VersionChain,
    VersionNotFound,
    WeightStoreError,
    download_version,
    load_state_dict,
    signing_key,
)
from asearcher.streams.wire.events import DeadLetter, WeightsPublished
from asearcher.streams.wire.topics import DEAD_LETTERS
from asearcher.trainer.runtime.deepspeed_setup import full_state_dict
from asearcher.trainer.runtime.service import TrainerService, last_announced
from asearcher.trainer.runtime.weight_publisher import WeightStore
from tests.support.rollout import FAST_GROUP, events_of
from tests.support.trainer import rewarded_groups, tiny_model_dir
from tests.support.trainer_service import send, trainer_config, trainer_topics

ROGUE_SHA = "0" * 64


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("untrusted-weights"))


@pytest.fixture(autouse=True)
def no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unauthenticated unless a test sets a key."""
    monkeypatch.delenv(ENV_WEIGHTS_KEY, raising=False)
    monkeypatch.delenv(ENV_WEIGHTS_KEY_FILE, raising=False)


def publish(store: WeightStore, version: int, seed: int = 0) -> PublishedVersion:
    """A self-consistent version: parent version - 1, step = version."""
    generator = torch.Generator().manual_seed(seed * 1000 + version)
    state = {"w": torch.randn(4, 4, generator=generator)}
    return store.publish_state_dict(version, step=version, parent_version=version - 1,
                                    state_dict=state)  # fmt: skip


def announcement(published: PublishedVersion, **changes) -> WeightsPublished:
    event = WeightsPublished(version=published.version, uri=published.uri,
                             sha256=published.sha256, step=published.manifest.step)  # fmt: skip
    return msgspec.structs.replace(event, **changes)


def names(event: WeightsPublished | None) -> tuple[int, str, str] | None:
    """What an announcement points at (events also carry their own id and time)."""
    return None if event is None else (event.version, event.uri, event.sha256)


def announce(settings, codec, topic: str, *events: WeightsPublished) -> None:
    with EventProducer(settings, codec) as producer:
        for event in events:
            producer.send(topic, event)


def follow(settings, codec, topic: str, store: WeightStore) -> tuple[WeightsFollower, list]:
    """A follower that read `topic` to its end, and the announcements it dead-lettered."""
    letters = EventProducer(settings, codec)
    follower = WeightsFollower(settings, codec, letters, topic=topic, store=store)

    async def catch_up() -> None:
        follower.start()
        while not follower.caught_up():
            await asyncio.sleep(0.05)

    asyncio.run(catch_up())
    follower.stop()
    letters.close()
    dead = [e for e in events_of(settings, codec, DEAD_LETTERS)
            if isinstance(e, DeadLetter) and e.origin_topic == topic]  # fmt: skip
    return follower, dead


def test_follower_ignores_a_version_the_store_lacks_and_keeps_following_real_ones(
    settings, codec, make_topic, tmp_path: Path
) -> None:
    topic = make_topic(like="weights")
    store = WeightStore((tmp_path / "weights").as_uri())
    v1, v2 = publish(store, 1), publish(store, 2)
    huge = WeightsPublished(version=1_000_000, uri=store.uri_of(1_000_000), sha256=ROGUE_SHA,
                            step=1_000_000)  # fmt: skip
    announce(settings, codec, topic, announcement(v1), huge, announcement(v2))
    follower, dead = follow(settings, codec, topic, store)
    assert names(follower.latest) == names(announcement(v2)) and follower.trainer_version(0) == 2
    assert follower.refused == 1
    [letter] = dead
    assert letter.error_type == "RefusedAnnouncement" and "does not follow v1" in letter.reason
    kept = codec.decode(letter.payload, letter.headers, (WeightsPublished,))
    assert names(kept) == names(huge)  # the whole announcement, for whoever looks into it


def test_follower_refuses_a_self_consistent_version_outside_the_store(
    settings, codec, make_topic, tmp_path: Path
) -> None:
    topic = make_topic(like="weights")
    store = WeightStore((tmp_path / "weights").as_uri())
    foreign = WeightStore((tmp_path / "elsewhere").as_uri())
    v1, v2 = publish(store, 1), publish(store, 2)
    publish(foreign, 1, seed=9)
    elsewhere = publish(foreign, 2, seed=9)  # valid manifest, checksums, parent and step
    announce(settings, codec, topic, announcement(v1), announcement(elsewhere), announcement(v2))
    follower, dead = follow(settings, codec, topic, store)
    assert names(follower.latest) == names(announcement(v2)) and follower.refused == 1
    [letter] = dead
    assert "not at" in letter.reason and store.uri_of(2) in letter.reason


def test_follower_refuses_an_older_manifest_announced_as_the_next_version(
    settings, codec, make_topic, tmp_path: Path
) -> None:
    topic = make_topic(like="weights")
    root = tmp_path / "weights"
    store = WeightStore(root.as_uri())
    real = [publish(store, version) for version in (1, 2, 3, 4)]
    # v4 announced as v5: at v4's own URI, and copied into v5's directory.
    as_next = announcement(real[3], version=5, step=5)
    shutil.copytree(root / "v000004", root / "v000005")
    in_place = announcement(real[3], version=5, step=5, uri=store.uri_of(5))
    announce(settings, codec, topic, *map(announcement, real), as_next, in_place)
    follower, dead = follow(settings, codec, topic, store)
    assert names(follower.latest) == names(announcement(real[3])) and follower.refused == 2
    reasons = [letter.reason for letter in dead]
    assert "not at" in reasons[0] and "claims version 4" in reasons[1]

    # The trainer's real v5 is still believed after both.
    store.remove([5])
    v5 = publish(store, 5)
    announce(settings, codec, topic, announcement(v5))
    follower, _ = follow(settings, codec, topic, store)
    assert names(follower.latest) == names(announcement(v5)) and follower.refused == 2


def test_version_chain_refuses_replays_and_skips_but_rejoins_at_versions_the_store_marked(
    tmp_path: Path,
) -> None:
    store = WeightStore((tmp_path / "weights").as_uri())
    versions = {v: publish(store, v) for v in (1, 2, 3, 4, 5)}

    def admit(chain: VersionChain, version: int) -> bool:
        event = announcement(versions[version])
        return chain.admit(event.version, event.uri, event.sha256, event.step)

    chain = VersionChain(store, "policy")
    assert admit(chain, 2)  # the first one seen: any version the store holds as announced
    assert not admit(chain, 2)  # the same announcement again
    with pytest.raises(WeightStoreError, match="not newer than v2"):
        admit(chain, 1)  # a replay of an older version
    with pytest.raises(WeightStoreError, match="does not follow v2"):
        admit(chain, 4)
    store.mark_announced(4)  # what the trainer writes once v4's announcement committed
    assert admit(chain, 4) and chain.newest == versions[4]
    with pytest.raises(WeightStoreError, match=r"disagrees: step 5 \(announced 6\)"):
        chain.admit(5, store.uri_of(5), versions[5].sha256, 6)
    assert chain.newest == versions[4]

    # Versions pruned since their announcement are passed over quietly, future ones refused.
    store.remove([1, 2])
    late = VersionChain(store, "policy")
    assert not admit(late, 1) and not admit(late, 2) and admit(late, 3)
    with pytest.raises(VersionNotFound):
        VersionChain(store, "policy").admit(9, store.uri_of(9), ROGUE_SHA, 9)


def test_trainer_ignores_rogue_announcements_and_resumes_at_its_own_last_version(
    settings, codec, make_topic, model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    topics = trainer_topics(make_topic)
    store = WeightStore((tmp_path / "weights").as_uri())
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    groups, _, _ = rewarded_groups(reference, groups=4, seed=31)
    send(settings, codec, topics.trajectories, [t for g in groups[:2] for t in g.trajectories])
    config = trainer_config(topics)
    first = TrainerService(settings, codec, config, model_dir, store, **FAST_GROUP)
    assert first.run(max_steps=1, timeout=120) == 1
    first.close()
    v1 = store.get(1)

    foreign = WeightStore((tmp_path / "elsewhere").as_uri())
    publish(foreign, 1)
    rogues = [
        WeightsPublished(version=1_000_000, uri=store.uri_of(1_000_000), sha256=ROGUE_SHA,
                         step=1_000_000),
        announcement(publish(foreign, 2)),  # self-consistent, outside the store
        announcement(v1, version=2, step=2),  # v1's manifest as v2
    ]  # fmt: skip
    announce(settings, codec, topics.weights, *rogues)

    second = TrainerService(settings, codec, config, model_dir, store, **FAST_GROUP)
    try:
        assert second.version == 1 and store.versions() == [1]
        resumed = full_state_dict(second.engine)
        stored = load_state_dict(v1.uri, v1.sha256)[1]
        assert all(torch.equal(resumed[name], stored[name]) for name in stored)
        send(settings, codec, topics.trajectories, [t for g in groups[2:] for t in g.trajectories])
        assert second.run(max_steps=1, timeout=120) == 1 and second.version == 2
    finally:
        second.close()
    # A producer on the same topic believes the trainer's v2, not the rogue ones before it.
    follower, dead = follow(settings, codec, topics.weights, store)
    assert follower.latest is not None and follower.latest.sha256 == store.get(2).sha256
    assert follower.refused == 3 and len(dead) == 3


def test_a_tombstone_on_weights_keeps_every_stored_version_and_the_trainer_resumes_at_v3(
    settings, codec, make_topic, model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    topics = trainer_topics(make_topic)
    store = WeightStore((tmp_path / "weights").as_uri())
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    groups, _, _ = rewarded_groups(reference, groups=8, seed=32)
    send(settings, codec, topics.trajectories, [t for g in groups[:6] for t in g.trajectories])
    config = trainer_config(topics)
    # Every trajectory was generated at v0: let v3 and v4 still train on them.
    config = msgspec.structs.replace(
        config, batching=msgspec.structs.replace(config.batching, eta=10)
    )
    trainer = TrainerService(settings, codec, config, model_dir, store, **FAST_GROUP)
    assert trainer.run(max_steps=3, timeout=180) == 3
    trainer.close()
    v3 = load_state_dict(store.get(3).uri, store.get(3).sha256)[1]

    def tombstone(topic: str) -> None:
        with EventProducer(settings, codec) as producer:
            producer.send_raw(topic, None, key=config.model)

    tombstone(topics.weights)
    # In the log, the tombstone is noise: dead-lettered, and v3 is still the last announced.
    assert last_announced(settings, codec, topics.weights, config.model, store) == store.get(3)
    # Once compacted, the topic holds the tombstone alone (then nothing): a topic like that.
    compacted = make_topic(like="weights")
    tombstone(compacted)
    restarted = msgspec.structs.replace(
        config, topics=msgspec.structs.replace(topics, weights=compacted)
    )
    trainer = TrainerService(settings, codec, restarted, model_dir, store, **FAST_GROUP)
    try:
        assert trainer.version == 3 and store.versions() == [1, 2, 3]
        resumed = full_state_dict(trainer.engine)
        assert all(torch.equal(resumed[name], v3[name]) for name in v3)
        # Training goes on from v3.
        send(settings, codec, topics.trajectories, [t for g in groups[6:] for t in g.trajectories])
        assert trainer.run(max_steps=1, timeout=120) == 1 and trainer.version == 4
    finally:
        trainer.close()
    letters = [
        e
        for e in events_of(settings, codec, DEAD_LETTERS)
        if isinstance(e, DeadLetter) and e.origin_topic in (topics.weights, compacted)
    ]
    assert letters and all("tombstone" in letter.reason for letter in letters)
    assert store.versions() == [1, 2, 3, 4] and store.announced() == [1, 2, 3, 4]
    # A producer joining the compacted topic believes v4, the first version it sees.
    follower, _ = follow(settings, codec, compacted, store)
    assert follower.latest is not None and follower.latest.version == 4


def test_trainer_will_not_start_over_stored_versions_no_step_of_its_own_left(
    settings, codec, make_topic, model_dir: Path, tmp_path: Path
) -> None:
    topics = trainer_topics(make_topic)
    store = WeightStore((tmp_path / "weights").as_uri())
    publish(store, 1)
    publish(store, 3)  # nothing announced either, and not what one crashed step leaves
    with pytest.raises(RuntimeError, match=r"holds versions \[1, 3\] after v0"):
        TrainerService(settings, codec, trainer_config(topics), model_dir, store, **FAST_GROUP)
    assert store.versions() == [1, 3]


def test_signed_versions_load_and_unsigned_or_wrongly_signed_ones_are_refused_with_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = (tmp_path / "weights").as_uri()
    monkeypatch.setenv(ENV_WEIGHTS_KEY, "the trainer's secret")
    v1 = publish(WeightStore(root), 1)
    assert (tmp_path / "weights" / "v000001" / SIGNATURE).is_file()
    manifest, state = load_state_dict(v1.uri, v1.sha256)
    assert manifest.version == 1 and set(state) == {"w"}

    # Forgeries with valid checksums: written without the key, or with another one.
    monkeypatch.delenv(ENV_WEIGHTS_KEY)
    unsigned = publish(WeightStore(root), 2)
    monkeypatch.setenv(ENV_WEIGHTS_KEY, "a guess")
    wrongly_signed = publish(WeightStore(root), 3)

    monkeypatch.setenv(ENV_WEIGHTS_KEY, "the trainer's secret")
    with pytest.raises(WeightStoreError, match="not signed"):
        load_state_dict(unsigned.uri, unsigned.sha256)
    with pytest.raises(WeightStoreError, match="not signed"):
        download_version(unsigned.uri, unsigned.sha256, tmp_path / "download")
    with pytest.raises(WeightStoreError, match="signature .* does not match"):
        load_state_dict(wrongly_signed.uri, wrongly_signed.sha256)
    with pytest.raises(WeightStoreError, match="signature .* does not match"):
        WeightStore(root).get(3)
    assert not (tmp_path / "download" / "model.safetensors").exists()

    # Without a key nothing is checked: versions are unauthenticated, as before.
    monkeypatch.delenv(ENV_WEIGHTS_KEY)
    for version in (v1, unsigned, wrongly_signed):
        assert load_state_dict(version.uri, version.sha256)[0].version == version.version


def test_with_a_key_a_producer_refuses_a_forged_version_planted_in_the_store(
    settings, codec, make_topic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = make_topic(like="weights")
    root = (tmp_path / "weights").as_uri()
    key_file = tmp_path / "weights.key"
    key_file.write_text("the trainer's secret\n")
    monkeypatch.setenv(ENV_WEIGHTS_KEY_FILE, str(key_file))
    store = WeightStore(root)
    v1 = publish(store, 1)
    monkeypatch.delenv(ENV_WEIGHTS_KEY_FILE)
    forged = publish(WeightStore(root), 2)  # right place, version, parent, step; no signature
    monkeypatch.setenv(ENV_WEIGHTS_KEY_FILE, str(key_file))
    announce(settings, codec, topic, announcement(v1), announcement(forged))
    follower, dead = follow(settings, codec, topic, WeightStore(root))
    assert names(follower.latest) == names(announcement(v1)) and follower.refused == 1
    [letter] = dead
    assert "not signed" in letter.reason


def test_the_key_comes_from_one_setting_and_a_bad_key_file_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert signing_key() is None
    key_file = tmp_path / "key"
    key_file.write_text("s3cret\n")
    monkeypatch.setenv(ENV_WEIGHTS_KEY_FILE, str(key_file))
    assert signing_key() == b"s3cret"
    monkeypatch.setenv(ENV_WEIGHTS_KEY, "s3cret")
    with pytest.raises(WeightStoreError, match="not both"):
        signing_key()
    monkeypatch.delenv(ENV_WEIGHTS_KEY)
    key_file.write_text("\n")
    with pytest.raises(WeightStoreError, match=f"{ENV_WEIGHTS_KEY_FILE}: .* is empty"):
        WeightStore((tmp_path / "weights").as_uri())
    monkeypatch.setenv(ENV_WEIGHTS_KEY_FILE, str(tmp_path / "missing"))
    with pytest.raises(WeightStoreError, match=f"{ENV_WEIGHTS_KEY_FILE}: cannot read"):
        signing_key()


def test_weights_sign_vouches_for_versions_from_before_the_key_and_show_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from asearcher.cli.weights import app

    root = (tmp_path / "weights").as_uri()
    old = publish(WeightStore(root), 1)
    WeightStore(root).mark_announced(1)
    monkeypatch.setenv(ENV_WEIGHTS_KEY, "new key")
    with pytest.raises(WeightStoreError, match="not signed"):
        load_state_dict(old.uri, old.sha256)
    listed = CliRunner().invoke(app, ["list", "--store", root])
    assert listed.exit_code == 0 and "refused" in listed.output

    signed = CliRunner().invoke(app, ["sign", "--store", root])
    assert signed.exit_code == 0 and "signed 1 versions: 1" in signed.output
    assert load_state_dict(old.uri, old.sha256)[0].version == 1
    shown = CliRunner().invoke(app, ["show", "1", "--store", root])
    assert shown.exit_code == 0
    assert (
        "announced:            yes" in shown.output and "signed:               yes" in shown.output
    )


def test_a_reader_catching_up_passes_over_pruned_versions_without_refusing_them(
    tmp_path: Path,
) -> None:
    store = WeightStore((tmp_path / "weights").as_uri())
    versions = {v: publish(store, v) for v in range(1, 9)}
    for version in versions:
        store.mark_announced(version)
    assert store.prune(keep_last=3) == [2, 3, 4, 5]  # the first version is kept

    def admit(version: int) -> bool:
        event = announcement(versions[version])
        return chain.admit(event.version, event.uri, event.sha256, event.step)

    # A restarted reader reads every announcement from the start of the topic.
    chain = VersionChain(store, "policy")
    assert admit(1)
    assert [admit(v) for v in (2, 3, 4, 5)] == [False] * 4  # pruned: passed over, not refused
    assert chain.newest == versions[1]
    assert admit(6) and admit(7) and chain.newest == versions[7]
    with pytest.raises(WeightStoreError, match="does not follow v7"):
        chain.admit(1_000_000, store.uri_of(1_000_000), ROGUE_SHA, 1_000_000)  # never stored
