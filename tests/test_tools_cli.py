"""The tools from the terminal: world generate, index build, search, browse."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from asearcher.cli.app import app
from asearcher.cli.errors import CliError


def test_world_generate_index_build_search_and_browse_from_the_cli(tmp_path: Path) -> None:
    runner = CliRunner()
    world = runner.invoke(app, ["world", "generate", "--out", str(tmp_path), "--entities", "60",
                                "--questions", "40"])  # fmt: skip
    assert world.exit_code == 0, world.output
    corpus = tmp_path / "corpus.jsonl"
    pages = [json.loads(line) for line in corpus.read_text().splitlines()]
    assert len(pages) == 60 and set(pages[0]) == {"url", "title", "contents"}

    index = tmp_path / "index"
    built = runner.invoke(app, ["index", "build", "--corpus", str(corpus), "--out", str(index),
                                "--no-dense"])  # fmt: skip
    assert built.exit_code == 0 and "indexed 60 pages" in built.output

    title, url = pages[7]["title"], pages[7]["url"]
    found = runner.invoke(app, ["search", title, "--index", str(index), "--mode", "bm25"])
    assert found.exit_code == 0 and f"URL: {url}" in found.output

    page = runner.invoke(app, ["browse", url, "--index", str(index)])
    assert page.exit_code == 0 and page.output.startswith(">>>> Page 1 >>>>")
    assert f"# {title}" in page.output

    nobody = "https://synthpedia.local/wiki/Nobody"
    missing = runner.invoke(app, ["browse", nobody, "--index", str(index)])
    assert isinstance(missing.exception, CliError)
    assert "no page at https://synthpedia.local/wiki/Nobody" in str(missing.exception)

    dense = runner.invoke(app, ["search", title, "--index", str(index), "--mode", "dense"])
    assert isinstance(dense.exception, CliError) and "no dense part" in str(dense.exception)


def test_index_build_names_a_missing_corpus(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["index", "build", "--corpus", str(tmp_path / "nope.jsonl"),
                                      "--out", str(tmp_path / "i")])  # fmt: skip
    assert isinstance(result.exception, CliError) and "--corpus" in str(result.exception)


def test_world_generate_leaves_guessable_kinds_out_and_says_what_guessing_scores(
    tmp_path: Path,
) -> None:
    runner = CliRunner(env={"COLUMNS": "200"})
    scores = {}
    for share in (None, "0.34"):
        args = ["world", "generate", "--out", str(tmp_path / str(share)), "--entities", "60",
                "--questions", "400"]  # fmt: skip
        done = runner.invoke(app, args + (["--max-answer-share", share] if share else []))
        assert done.exit_code == 0, done.output
        # rich wraps at the console's width: read the words, not the lines
        words = " ".join(done.output.split())
        said = re.search(r"answered without reading .*? EM ([\d.]+) on", words)
        assert said, done.output
        scores[share] = float(said[1])
        held_out = (tmp_path / str(share) / "qa_test.jsonl").read_text()
        assert ("In which country" in held_out) is (share is None)
    assert scores[None] > 0.2 > scores["0.34"]
    refused = runner.invoke(app, ["world", "generate", "--out", str(tmp_path / "x"),
                                  "--max-answer-share", "0"])  # fmt: skip
    assert refused.exit_code != 0 and "--max-answer-share" in str(refused.exception)
