"""`asearcher plot`: a run's curves as PNG files, from events alone or from the log."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import typer
from matplotlib.image import imread
from typer.testing import CliRunner

from asearcher.cli.errors import CliError
from asearcher.cli.jobs.plots import plot_run
from asearcher.cli.plot import plot
from asearcher.streams.io.producer import EventProducer
from asearcher.streams.wire.events import EvalResult, StepStats, TrainerStepFinished
from asearcher.streams.wire.topics import EVAL_RESULTS, TRAINER_METRICS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TRAINING_FIGURES = {"reward.png", "staleness.png", "throughput.png"}


def steps(model: str = "exp", versions: range = range(1, 5)) -> list[TrainerStepFinished]:
    return [
        TrainerStepFinished(
            model=model,
            version=v,
            step=v,
            stats=StepStats(
                reward_mean=0.1 * v, loss=1.0 / v, samples=16, tokens=1000 + v, seconds=1.0
            ),
            staleness_counts=[4, v % 3],
            dropped_stale=v % 2,
            created_at=1000.0 + 3 * v,
        )  # fmt: skip
        for v in versions
    ]


def results(benchmark: str, model: str = "exp", versions: range = range(0, 5, 2)) -> list:
    return [
        EvalResult(
            eval_id=f"e{v}",
            model=model,
            benchmark=benchmark,
            policy_version=v,
            questions=10,
            samples_per_question=4,
            averages={"f1": 0.1 * v, "em": 0.05 * v, "searches": 1.5, "gen_len": 300.0},
            best_of_k={"f1": 0.2 * v, "em": 0.1 * v},
        )  # fmt: skip
        for v in versions
    ]


def assert_pngs(paths: list[Path]) -> None:
    for path in paths:
        assert path.read_bytes()[:8] == PNG_SIGNATURE, path
        height, width = imread(path).shape[:2]  # decodes whole: a truncated file fails here
        assert height > 100 and width > 100


def test_a_full_run_gets_training_figures_and_one_per_benchmark(tmp_path: Path) -> None:
    written = plot_run(steps(), results("hotpotqa") + results("nq"), tmp_path / "plots")
    assert {p.name for p in written} == TRAINING_FIGURES | {"eval-hotpotqa.png", "eval-nq.png"}
    assert all(p.parent == tmp_path / "plots" for p in written)
    assert_pngs(written)
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(p.name for p in written)


def test_the_figures_follow_the_events_present(tmp_path: Path) -> None:
    only_eval = plot_run([], results("nq"), tmp_path / "eval")
    assert [p.name for p in only_eval] == ["eval-nq.png"]
    only_training = plot_run(steps(), [], tmp_path / "train")
    assert {p.name for p in only_training} == TRAINING_FIGURES
    assert_pngs(only_eval + only_training)


def test_benchmark_names_that_clash_as_file_names_get_their_own_files(tmp_path: Path) -> None:
    written = plot_run([], results("a/b") + results("a b"), tmp_path)
    assert len({p.name for p in written}) == 2
    assert all(p.parent == tmp_path for p in written)  # no sub-directory from the slash
    assert_pngs(written)


def test_a_single_step_and_a_step_without_staleness_still_plot(tmp_path: Path) -> None:
    lone = TrainerStepFinished(model="exp", version=7, step=7, stats=StepStats(reward_mean=0.5))
    written = plot_run([lone], [], tmp_path)
    assert {p.name for p in written} == TRAINING_FIGURES
    assert_pngs(written)


def test_an_empty_run_is_a_one_line_error_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(CliError) as caught:
        plot_run([], [], tmp_path / "plots")
    assert "\n" not in str(caught.value) and "nothing to plot" in str(caught.value)
    assert not (tmp_path / "plots").exists()


# -- the command, against the broker ---------------------------------------------------------------


def command() -> typer.Typer:
    app = typer.Typer()
    app.command()(plot)
    return app


def test_the_command_plots_one_run_from_the_log(settings, codec, tmp_path: Path) -> None:
    run, other = f"run-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
    with EventProducer(settings, codec) as producer:
        for event in steps(run) + steps(other, range(1, 9)):
            producer.send(TRAINER_METRICS, event)
        for event in results("hotpotqa", run) + results("nq", other):
            producer.send(EVAL_RESULTS, event)
    cluster = ["--bootstrap-servers", settings.bootstrap_servers, "--home", str(tmp_path / "h")]
    out = tmp_path / "plots"
    outcome = CliRunner().invoke(command(), ["--run", run, "--out", str(out), *cluster])
    assert outcome.exit_code == 0, outcome.output
    assert {p.name for p in out.iterdir()} == TRAINING_FIGURES | {"eval-hotpotqa.png"}
    assert "4 trainer steps, 3 evaluation results" in outcome.output
    assert str(out / "reward.png") in outcome.output.replace("\n", "")

    missing = CliRunner().invoke(command(), ["--run", "nobody", "--out", str(out), *cluster])
    assert isinstance(missing.exception, CliError)
    assert "'nobody' has no events" in str(missing.exception)
    assert other in str(missing.exception)  # the runs it did see, to spot a typo
