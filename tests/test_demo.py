"""The README's first command, on a small world: the whole pipeline runs end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from asearcher.cli.app import app


@pytest.mark.slow
def test_demo_rolls_out_with_the_expert_and_the_cpu_model(settings, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [
        "demo", "--questions", "2", "--group-size", "2", "--entities", "60",
        "--max-new-tokens", "16", "--bootstrap-servers", settings.bootstrap_servers,
        "--home", str(tmp_path),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    out = result.output
    assert "expert: groups=2 trajectories=4" in out
    assert "transformers: groups=2 trajectories=4" in out
    assert "Finished trajectories by group" in out
    assert "1.00 1.00" in out, out  # the expert's groups answer correctly
    assert "max_turns" in out  # the untrained CPU model does not: it never acts
    assert "group demo-trainer consumed" in out and "Consumer groups" in out
    assert (tmp_path / "demo" / "model" / "model.safetensors").is_file()
