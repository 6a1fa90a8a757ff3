"""Policy weights go into the versioned store and come back bit-equal, or not at all."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import boto3
import fsspec
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from asearcher.cli.errors import CliError
from asearcher.cli.weights import app
from asearcher.streams.storage.weight_reader import (
    WeightStoreError,
    download_version,
    load_state_dict,
    read_manifest,
)
from asearcher.trainer.runtime.weight_publisher import WeightStore

CONFIG = {"model_type": "tiny", "architectures": ["TinyLM"], "vocab_size": 32, "hidden_size": 8}


class TinyLM(nn.Module):
    """Embeddings tied to the output head, like most small causal LMs."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 32, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("rotary", torch.arange(16, dtype=torch.bfloat16).reshape(4, 4).t())


@pytest.fixture
def make_store(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Callable[[str], WeightStore]:
    """A fresh, empty store on `backend` ("file" or "s3")."""

    def make(backend: str) -> WeightStore:
        if backend == "file":
            return WeightStore((tmp_path / f"weights-{time.time_ns()}").as_uri())
        endpoint = request.getfixturevalue("s3_endpoint")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        bucket = f"weights-{time.time_ns()}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        options = {"client_kwargs": {"endpoint_url": endpoint}}
        return WeightStore(f"s3://{bucket}/policy", storage_options=options)

    return make


def tokenizer_dir(tmp_path: Path) -> Path:
    path = tmp_path / "tokenizer"
    path.mkdir(exist_ok=True)
    (path / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    (path / "merges.txt").write_text("a b\n")
    (path / "optimizer.pt").write_bytes(b"not a tokenizer file")
    return path


def raw_bytes(store: WeightStore, uri: str) -> bytes:
    fs, path = fsspec.core.url_to_fs(uri, **store.storage_options)
    return fs.cat_file(path)


def publish_simple(store: WeightStore, version: int, payload: bytes = b"w") -> None:
    store.publish(version, step=version * 10, parent_version=version - 1 or None,
                  files={"model.safetensors": payload + bytes([version])})  # fmt: skip


def make_debris(store: WeightStore, version: int) -> None:
    """The files of a publish that crashed before its manifest."""
    fs, path = fsspec.core.url_to_fs(store.uri_of(version), **store.storage_options)
    fs.makedirs(path, exist_ok=True)
    fs.pipe_file(f"{path}/model.safetensors", b"half written")


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_state_dict_round_trip_gives_equal_tensors_and_matching_checksums(
    make_store, tmp_path: Path, backend: str
) -> None:
    torch.manual_seed(0)
    store, module = make_store(backend), TinyLM()
    state = module.state_dict()
    assert state["embed.weight"].data_ptr() == state["head.weight"].data_ptr()  # really tied
    published = store.publish_state_dict(
        3, step=120, parent_version=2, state_dict=state, config=CONFIG,
        tokenizer_dir=tokenizer_dir(tmp_path), trained_ids=["t-1", "t-2"],
    )  # fmt: skip

    assert published.uri == store.uri_of(3) and published.uri.startswith(f"{backend}://")
    assert published.uri.endswith("/v000003")
    manifest_bytes = raw_bytes(store, f"{published.uri}/manifest.json")
    assert hashlib.sha256(manifest_bytes).hexdigest() == published.sha256
    model_bytes = raw_bytes(store, f"{published.uri}/model.safetensors")
    manifest = published.manifest
    assert manifest.files["model.safetensors"] == hashlib.sha256(model_bytes).hexdigest()
    assert manifest.sizes["model.safetensors"] == len(model_bytes)
    assert manifest.tokenizer_files == ["merges.txt", "tokenizer.json", "tokenizer_config.json"]
    assert set(manifest.files) == {"model.safetensors", *manifest.tokenizer_files}
    assert (manifest.step, manifest.parent_version, manifest.config) == (120, 2, CONFIG)
    assert manifest.trained_ids == ["t-1", "t-2"]
    assert store.versions() == [3] and store.latest() == published == store.get(3)

    loaded_manifest, tensors = load_state_dict(
        published.uri, published.sha256, store.storage_options
    )
    assert loaded_manifest == manifest
    assert set(tensors) == set(state)
    for name, tensor in state.items():
        assert tensors[name].dtype == tensor.dtype and torch.equal(tensors[name], tensor), name
    fresh = TinyLM()
    fresh.load_state_dict(tensors)
    assert torch.equal(fresh.head.weight, module.embed.weight)

    local = tmp_path / "engine"
    download_version(published.uri, published.sha256, local, store.storage_options)
    assert (local / "model.safetensors").read_bytes() == model_bytes
    assert (local / "merges.txt").read_text() == "a b\n"
    assert json.loads((local / "config.json").read_text()) == CONFIG
    assert not (local / "optimizer.pt").exists()
    assert sorted(p.name for p in local.iterdir() if p.name.startswith(".")) == []


def test_corrupted_model_file_is_detected_on_load(make_store) -> None:
    store = make_store("file")
    published = store.publish_state_dict(
        1, step=1, parent_version=None, state_dict=TinyLM().state_dict()
    )
    path = Path(published.uri.removeprefix("file://")) / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # same size, different bytes
    path.write_bytes(bytes(data))

    with pytest.raises(WeightStoreError, match="model.safetensors"):
        load_state_dict(published.uri, published.sha256)
    with pytest.raises(WeightStoreError, match="model.safetensors"):
        store.read_file(1, "model.safetensors")
    with pytest.raises(WeightStoreError, match="model.safetensors"):
        download_version(published.uri, published.sha256, path.parent.parent / "engine")
    assert not (path.parent.parent / "engine" / "model.safetensors").exists()


def test_wrong_or_tampered_manifest_sha_is_detected(make_store) -> None:
    store = make_store("file")
    published = store.publish(1, step=5, parent_version=None, files={"model.safetensors": b"x"})
    assert read_manifest(published.uri, published.sha256) == published.manifest
    with pytest.raises(WeightStoreError, match="manifest.json"):
        load_state_dict(published.uri, "0" * 64)

    path = Path(published.uri.removeprefix("file://")) / "manifest.json"
    path.write_bytes(path.read_bytes().replace(b'"step":5', b'"step":6'))
    with pytest.raises(WeightStoreError, match="does not match sha256"):
        read_manifest(published.uri, published.sha256)
    path.write_bytes(b"{not json")
    with pytest.raises(WeightStoreError, match="bad manifest.json"):
        store.get(1)


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_version_without_manifest_is_invisible(make_store, backend: str) -> None:
    store = make_store(backend)
    assert store.versions() == [] and store.latest() is None
    publish_simple(store, 1)
    make_debris(store, 2)

    assert store.versions() == [1]
    latest = store.latest()
    assert latest is not None and latest.version == 1
    with pytest.raises(WeightStoreError, match="no published version"):
        store.get(2)
    with pytest.raises(WeightStoreError, match="no published version"):
        read_manifest(store.uri_of(2), storage_options=store.storage_options)


def test_publish_retry_is_idempotent_but_a_conflicting_overwrite_is_refused(make_store) -> None:
    store = make_store("file")
    first = store.publish(4, step=40, parent_version=3, files={"model.safetensors": b"weights"})
    time.sleep(0.01)
    retry = store.publish(4, step=40, parent_version=3, files={"model.safetensors": b"weights"})
    assert retry == first  # the original, created_at included: nothing was rewritten

    with pytest.raises(WeightStoreError, match="already exists"):
        store.publish(4, step=41, parent_version=3, files={"model.safetensors": b"other"})
    assert store.read_file(4, "model.safetensors") == b"weights"
    assert store.get(4).sha256 == first.sha256


@pytest.mark.parametrize(
    "name", ["../escape", "/abs", "manifest.json", "a/../../b", "", "a//b", "./a"]
)
def test_publish_refuses_file_names_outside_the_version(make_store, name: str) -> None:
    store = make_store("file")
    with pytest.raises(WeightStoreError, match="file name"):
        store.publish(1, step=1, parent_version=None, files={name: b"x"})
    assert store.versions() == []


@pytest.mark.parametrize("backend", ["file", "s3"])
def test_prune_keeps_last_and_every_nth_and_clears_crash_debris(make_store, backend: str) -> None:
    store = make_store(backend)
    for version in range(1, 11):
        if version == 6:
            make_debris(store, version)  # a crashed publish, superseded by 7..10
        else:
            publish_simple(store, version)
    make_debris(store, 11)  # newer than the latest: a publish in progress, left alone

    planned = store.prune(keep_last=3, keep_every=4, dry_run=True)
    assert planned == [2, 3, 5, 6, 7]  # the oldest stays: re-training starts there
    assert store.versions() == [1, 2, 3, 4, 5, 7, 8, 9, 10]  # a dry run deletes nothing

    assert store.prune(keep_last=3, keep_every=4) == planned
    assert store.versions() == [1, 4, 8, 9, 10]
    fs, root = fsspec.core.url_to_fs(store.root_url, **store.storage_options)
    fs.invalidate_cache()
    left = {p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)}
    assert left == {"v000001", "v000004", "v000008", "v000009", "v000010", "v000011"}
    with pytest.raises(WeightStoreError):
        store.get(2)
    assert store.read_file(8, "model.safetensors") == b"w\x08"

    assert store.prune(keep_last=1) == [4, 8, 9]
    assert store.versions() == [1, 10]


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})


def test_cli_list_show_and_prune(make_store, tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = WeightStore((home / "weights").as_uri())  # the default store under --home
    for version in (1, 2, 3):
        publish_simple(store, version, payload=b"x" * 2000)

    listed = invoke("list", env={"ASEARCHER_HOME": str(home)})
    assert listed.exit_code == 0, listed.output
    rows = [line.split("│")[1:-1] for line in listed.output.splitlines() if line.count("│") > 2]
    # A long store URL (a deeper tmp_path) wraps onto continuation lines with no version.
    cells = [cells for cells in ([c.strip() for c in row] for row in rows) if cells[0]]
    assert [row[:4] for row in cells] == [["1", "10", "-", "1"], ["2", "20", "1", "1"],
                                          ["3", "30", "2", "1"]]  # fmt: skip
    assert cells[0][4] == "2.0 KiB"

    shown = invoke("show", "2", "--store", store.root_url)
    assert shown.exit_code == 0, shown.output
    manifest = store.get(2)
    assert f"manifest sha256:      {manifest.sha256}" in shown.output
    sha = manifest.manifest.files["model.safetensors"]
    assert f"  {sha}           2,001  model.safetensors" in shown.output
    assert "parent version:       1" in shown.output

    missing = invoke("show", "9", env={"ASEARCHER_WEIGHT_STORE": store.root_url})
    assert isinstance(missing.exception, CliError) and "no published version" in str(
        missing.exception
    )

    dry = invoke("prune", "--keep-last", "1", "--dry-run", "--store", store.root_url)
    assert dry.exit_code == 0 and "would remove 1 version: 2" in dry.output
    assert "kept: 1, 3" in dry.output and store.versions() == [1, 2, 3]
    pruned = invoke("prune", "--keep-last", "1", "--store", store.root_url)
    assert pruned.exit_code == 0 and "removed 1 version: 2" in pruned.output
    assert store.versions() == [1, 3]
    again = invoke("prune", "--keep-last", "1", "--store", store.root_url)
    assert "nothing to prune" in again.output

    empty = invoke("list", "--store", (tmp_path / "none").as_uri())
    assert empty.exit_code == 0 and "no published versions" in empty.output
