"""The sha256-sharded store the claim check, the result store and the page cache share."""

from __future__ import annotations

import hashlib
import os
import stat
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from asearcher.consumers.tools.backends import Page
from asearcher.consumers.tools.result_store import ResultStore
from asearcher.consumers.tools.web import PageCache
from asearcher.streams.storage.claimcheck import ClaimCheckStore
from asearcher.streams.storage.sharded_store import NotARegularFile, ShardedStore
from asearcher.streams.wire.events import ToolResultReady


def sha(key: str | bytes) -> str:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).hexdigest()


def test_a_key_lives_under_two_hex_digits_of_its_sha256(tmp_path: Path) -> None:
    store = ShardedStore(f"{tmp_path.as_uri()}/s/", suffix=".json")
    digest = sha("call-1")
    assert store.path("call-1") == f"{tmp_path}/s/{digest[:2]}/{digest}.json"
    assert store.path(b"call-1") == store.path("call-1")
    assert store.uri(store.path("call-1")) == f"file://{tmp_path}/s/{digest[:2]}/{digest}.json"
    assert store.url == f"{tmp_path.as_uri()}/s"


def test_write_read_and_exists_on_a_local_disk(tmp_path: Path) -> None:
    store = ShardedStore(tmp_path.as_uri())
    path = store.path("k")
    assert not store.exists(path)
    with pytest.raises(FileNotFoundError):
        store.read(path)
    assert store.write(path, b"first")
    assert store.exists(path) and store.read(path) == b"first"
    assert not store.write(path, b"second", replace=False)  # the first one stays
    assert store.read(path) == b"first"
    assert store.write(path, b"third")
    assert store.read(path) == b"third"
    assert store.read(path, max_bytes=2) == b"th"
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_local_files_are_shared_not_private(tmp_path: Path) -> None:
    store = ShardedStore(tmp_path.as_uri())
    old = os.umask(0o022)
    try:
        store.write(store.path("k"), b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(store.path("k")).st_mode) == 0o644


def test_racing_exclusive_writers_leave_exactly_the_first_whole_file(tmp_path: Path) -> None:
    store = ShardedStore(tmp_path.as_uri())
    path = store.path("race")
    payloads = [bytes([i]) * 200_000 for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        won = list(pool.map(lambda data: store.write(path, data, replace=False), payloads))
    assert won.count(True) == 1
    assert store.read(path) == payloads[won.index(True)]


@pytest.mark.timeout(30)  # a FIFO opened blocking would hang here instead of failing
@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_only_regular_files_are_read(tmp_path: Path, kind: str) -> None:
    store = ShardedStore((tmp_path / "s").as_uri())
    path = Path(store.path("k"))
    path.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        (tmp_path / "elsewhere").write_bytes(b"secret")
        path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError) as refused:
        store.read(str(path))
    if kind != "symlink":  # a final symlink is not even opened (ELOOP)
        assert isinstance(refused.value, NotARegularFile)


def test_an_object_store_checks_before_writing_and_refuses_directories() -> None:
    store = ShardedStore(f"memory://sharded-{uuid.uuid4().hex[:8]}", suffix=".bin")
    assert not store.local
    path = store.path("k")
    assert store.write(path, b"one") and not store.write(path, b"two", replace=False)
    assert store.read(path) == b"one" and store.read(path, max_bytes=1) == b"o"
    assert store.write(path, b"three") and store.read(path) == b"three"
    store.fs.makedirs(store.path("d"), exist_ok=True)
    store.fs.pipe(f"{store.path('d')}/inner", b"x")  # an object "under" the path: a directory
    with pytest.raises(NotARegularFile):
        store.read(store.path("d"))
    with pytest.raises(FileNotFoundError):
        store.read(store.path("absent"))


# -- the three users keep their on-disk layouts (existing stores stay readable) -------------------


def test_the_result_store_page_cache_and_claim_check_keep_their_layouts(tmp_path: Path) -> None:
    result = ToolResultReady(call_id="c1", trajectory_id="t", tool="search", text="x")
    ResultStore((tmp_path / "results").as_uri()).put_first(result)
    page = Page(url="https://example.com/", title="t", markdown="m")
    PageCache(str(tmp_path / "pages")).put(page)
    payload = b"a payload" * 10
    reference = ClaimCheckStore((tmp_path / "claims").as_uri()).put(payload, "x", "Kind")
    expected = {
        tmp_path / "results" / sha("c1")[:2] / f"{sha('c1')}.json",
        tmp_path / "pages" / sha(page.url)[:2] / f"{sha(page.url)}.json",
        tmp_path / "claims" / sha(payload)[:2] / sha(payload),
    }
    assert {p for p in tmp_path.rglob("*") if p.is_file()} == expected
    assert reference.uri == (tmp_path / "claims" / sha(payload)[:2] / sha(payload)).as_uri()
