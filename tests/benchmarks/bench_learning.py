"""Does async RL make the agent better? The main job, `asearcher learn`, once per seed.

Each seed runs the embedded learning run (`infra/recipes/cpu-learn.toml`) as a user runs it: the
CLI in a subprocess against the session's broker, every service supervised, the transformers
engine playing the policy, DeepSpeed in the trainer. The run is renamed `bench-learn-s<seed>`
and the trainer's and the feeder's seeds set to the seed; the world and the policy are
shared, and each seed clones its own v1 from the scripted expert on the same two other worlds,
so each starts RL from the same kind of warm start.

Per seed: F1 on the held-out questions before RL (v1) and after (the version `learn` scores:
the last, or with `eval.keep_best` the one its continuous evaluations rated best), the change
in points with its paired noise, RL steps and trajectories trained, the share of flat groups,
staleness, searches and pages per sample before and after, the RL phase's length, what
answering the held-out questions without reading scores (their templates' commonest train
answers), the held-out curve (before, after) and the continuous evaluations (F1 per version, of
the questions `eval.config.split` names: validation ones in the embedded run), and where
`eval.keep_best` scored another version than the last, the last one's held-out F1 on the same
questions (`learn --score-last`). Across seeds: the mean change, its spread, how many seeds
changed beyond their paired noise, and what keep_best gained over the last version.
Target (issue: the agent learns): +15 points within 30 minutes of RL.

Knobs (environment): ASEARCHER_BENCH_SEEDS (default "1,2,3"), ASEARCHER_BENCH_MINUTES (RL
minutes per seed, default 30), ASEARCHER_BENCH_EVAL_QUESTIONS (default: every held-out
question of the run's world, 162 in the embedded run, so one right answer is 0.3 points),
ASEARCHER_BENCH_RUN (a run config to measure instead of the embedded learning run, e.g. a copy
with one setting changed; its results are named after the file).
Each seed also spends ~5 minutes on its warm start and ~3 on the two evaluations; the first
one ~10 more building the world, the policy and the expert's demonstrations. Writes
results/learning.json, results/learning.png and each seed's log (learning-<file stem>.* for
another run config).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import uuid
from pathlib import Path

import pytest
from harness import RESULTS_DIR, show_table, write_results

from asearcher.cli.jobs.learning import (
    HELD_OUT_SAMPLES,
    SUMMARY_FILE,
    LearnSummary,
    flat_share,
    learning_run_file,
    read_summary,
)
from asearcher.cli.run.config import run_dir
from asearcher.consumers.observability.metrics_processor import staleness_stats
from tests.support.runs import ASEARCHER

SEEDS = [int(s) for s in os.environ.get("ASEARCHER_BENCH_SEEDS", "1,2,3").split(",")]
# A variant of the learning run to measure over seeds instead (its name is replaced per seed).
RUN_FILE = Path(os.environ.get("ASEARCHER_BENCH_RUN", "") or learning_run_file())
RESULTS = "learning" if RUN_FILE == learning_run_file() else f"learning-{RUN_FILE.stem}"
MINUTES = float(os.environ.get("ASEARCHER_BENCH_MINUTES", "30"))
# None: every held-out question (`learn`'s own default).
EVAL_QUESTIONS = (
    int(os.environ["ASEARCHER_BENCH_EVAL_QUESTIONS"])
    if os.environ.get("ASEARCHER_BENCH_EVAL_QUESTIONS")
    else None
)
TARGET_POINTS = 15.0


def seeded_run(name: str, seed: int) -> str:
    """The learning run (`RUN_FILE`) renamed `name`, its trainer and feeder seeded with `seed`."""
    text = RUN_FILE.read_text()
    for header in ("[trainer.config]", "[feeder.config]"):
        assert f"\n{header}\n" in text, f"the learning run has no {header} table"
        text = text.replace(f"\n{header}\n", f"\n{header}\nseed = {seed}\n", 1)
    named = re.search(r'^name = "[^"]*"$', text, re.MULTILINE)
    assert named, f"{RUN_FILE} names no run"
    return text[: named.start()] + f'name = "{name}"' + text[named.end() :]


def curve(summary: LearnSummary) -> list[tuple[int, float]]:
    """F1 per version of the continuous evaluations (their own questions), in version order."""
    return sorted({(r.policy_version, r.averages.get("f1", 0.0)) for r in summary.evaluations})


def seed_row(seed: int, summary: LearnSummary) -> dict[str, object]:
    """The figures of one seed's run."""
    counts: list[int] = []
    for step in summary.steps:
        counts += [0] * (len(step.staleness_counts) - len(counts))
        for age, count in enumerate(step.staleness_counts):
            counts[age] += count
    mean_staleness, oldest = staleness_stats(counts) or (0.0, 0)
    before, after = (summary.before.averages.get("f1", 0.0), summary.after.averages.get("f1", 0.0))
    paired = summary.paired_noise("f1")
    trained_groups, flat = flat_share(summary.steps, summary.drops)
    per_sample = {
        f"{count}_{when}": result.averages.get(count, 0.0)
        for count in ("searches", "accesses", "turns")
        for when, result in (("before", summary.before), ("after", summary.after))
    }
    return {
        "seed": seed, "f1_before": before, "f1_after": after,
        "questions": len(summary.before_by_question.get("f1", {})),
        "change_points": 100.0 * (after - before),
        "noise_points": _noise_points(paired),
        "flat_share": flat / max(trained_groups + flat, 1), **per_sample,
        "flat_share_late": late_flat_share(summary), "groups_played": trained_groups + flat,
        "format_before": summary.before.averages.get("format", 0.0),
        "format_after": summary.after.averages.get("format", 0.0),
        "versions": [summary.before.policy_version, summary.after.policy_version],
        "last_version": summary.choice.last if summary.choice else summary.after.policy_version,
        "best_rated": summary.choice.best if summary.choice else None,
        # The last version on the same held-out questions where another was scored: the
        # chosen's gain over it measures `eval.keep_best` (None: the last was the one scored).
        "f1_last": summary.last_after.averages.get("f1", 0.0) if summary.last_after else None,
        "keep_best_noise_points": _noise_points(summary.paired_noise("f1", after_last=True)),
        "steps": len(summary.steps), "trajectories": sum(s.stats.samples for s in summary.steps),
        "reward_means": [round(s.stats.reward_mean, 4) for s in summary.steps],
        "staleness_mean": mean_staleness, "staleness_max": oldest,
        "rl_minutes": summary.rl_seconds / 60.0, "curve": curve(summary),
        "f1_without_reading": summary.without_reading.get("f1"),
    }  # fmt: skip


def _noise_points(noise: float | None) -> float | None:
    return None if noise is None else 100.0 * noise


def late_flat_share(summary: LearnSummary) -> float | None:
    """The flat share of the groups met in the second half of the steps: a feeder that passes
    over flat questions (`revisit_flat_every`) can only act after the first epoch."""
    if len(summary.steps) < 2:
        return None
    middle = summary.steps[len(summary.steps) // 2].version
    # A step reports the flat groups met before it; a drop those met at its version.
    steps = [s for s in summary.steps if s.version > middle]
    drops = [d for d in summary.drops if d.version >= middle]
    trained_groups, flat = flat_share(steps, drops)
    return flat / max(trained_groups + flat, 1)


def reading_rose(row: dict[str, object]) -> bool:
    """Whether searches + pages per sample rose under RL (the paper: RL lengthens the search)."""
    before = float(row["searches_before"]) + float(row["accesses_before"])  # type: ignore[arg-type]
    after = float(row["searches_after"]) + float(row["accesses_after"])  # type: ignore[arg-type]
    return after > before


def _scored_and_last(row: dict[str, object]) -> str:
    """`vN (vM F1 x)`: the version scored, and the last with its held-out F1 where it was not."""
    scored, last = row["versions"][1], row["last_version"]  # type: ignore[index]
    if row["f1_last"] is None:
        return f"v{scored} (the last)"
    noise = _points(row["keep_best_noise_points"])
    return f"v{scored} (last v{last}: {row['f1_last']:.3f} {noise})"


def _points(value: object) -> str:
    return "-" if value is None else f"±{value:.1f}"


def plot(rows: list[dict[str, object]], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for row in rows:
        versions, scores = zip(*row["curve"], strict=True)  # type: ignore[misc]
        line = axes.plot(versions, scores, marker=".", alpha=0.6, label=f"seed {row['seed']}")
        held_out = row["versions"], (row["f1_before"], row["f1_after"])  # type: ignore[index]
        axes.plot(*held_out, marker="s", linestyle="--", color=line[0].get_color())
    axes.set(xlabel="weight version", ylabel="F1")
    axes.set_title("continuous evaluations (dots), held-out F1 before/after (squares)", fontsize=10)
    axes.legend()
    figure.savefig(path, dpi=100)


@pytest.mark.benchmark
@pytest.mark.timeout(int(len(SEEDS) * (MINUTES + 30) * 60))
def test_learning_per_seed(broker, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "ASEARCHER_HOME": str(home), "COLUMNS": "200",
           "ASEARCHER_BOOTSTRAP_SERVERS": broker.bootstrap_servers}  # fmt: skip
    rows = []
    for seed in SEEDS:
        name = f"bench-learn-s{seed}-{uuid.uuid4().hex[:4]}"
        config = home / f"{name}.toml"
        config.write_text(seeded_run(name, seed))
        args = [ASEARCHER, "learn", "-c", str(config), "--minutes", str(MINUTES), "--score-last"]
        if EVAL_QUESTIONS is not None:
            args += ["--eval-questions", str(EVAL_QUESTIONS)]
        result = subprocess.run(args, env=env, capture_output=True, text=True, cwd="/")
        (RESULTS_DIR / f"{RESULTS}-s{seed}.log").write_text(result.stdout + result.stderr)
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
        rows.append(seed_row(seed, read_summary(run_dir(home, name) / SUMMARY_FILE)))

    changes = [float(r["change_points"]) for r in rows]  # type: ignore[arg-type]
    show_table(
        f"async RL for {MINUTES:g} min from the warm start, "
        f"held-out F1 ({rows[0]['questions']} q x {HELD_OUT_SAMPLES})",
        ["seed", "F1 before", "F1 after", "change (pts)", "noise (paired)", "steps",
         "scored (last: F1, noise)", "trajectories", "flat", "flat 2nd half", "staleness mean/max",
         "searches", "pages", "format after", "F1 without reading"],
        [[r["seed"], f"{r['f1_before']:.3f}", f"{r['f1_after']:.3f}",
          f"{r['change_points']:+.1f}", _points(r["noise_points"]), r["steps"],
          _scored_and_last(r), r["trajectories"],
          f"{r['flat_share']:.0%}",
          "-" if r["flat_share_late"] is None else f"{r['flat_share_late']:.0%}",
          f"{r['staleness_mean']:.2f}/{r['staleness_max']}",
          f"{r['searches_before']:.2f} -> {r['searches_after']:.2f}",
          f"{r['accesses_before']:.2f} -> {r['accesses_after']:.2f}", f"{r['format_after']:.2f}",
          "-" if r["f1_without_reading"] is None else f"{r['f1_without_reading']:.3f}"]
         for r in rows],
    )  # fmt: skip
    spread = statistics.stdev(changes) if len(changes) > 1 else 0.0
    beyond = sum(r["noise_points"] is not None and r["change_points"] > r["noise_points"]
                 for r in rows)  # fmt: skip
    reading = sum(reading_rose(r) for r in rows)
    print(f"change: mean {statistics.mean(changes):+.1f} points, sd {spread:.1f} "
          f"(target +{TARGET_POINTS:g}); reached by {sum(c >= TARGET_POINTS for c in changes)} "
          f"of {len(changes)} seeds; beyond its paired noise in {beyond}; searches + pages "
          f"per sample rose in {reading}")  # fmt: skip
    # What `eval.keep_best` changed: the scored version against the last, where they differ.
    gains = [100.0 * (float(r["f1_after"]) - float(r["f1_last"]))  # type: ignore[arg-type]
             for r in rows if r["f1_last"] is not None]  # fmt: skip
    if gains:
        print(f"keep_best: the scored version against the last {statistics.mean(gains):+.1f} "
              f"points on average, in the {len(gains)} seed(s) where they differ")  # fmt: skip
    plot(rows, RESULTS_DIR / f"{RESULTS}.png")
    write_results(RESULTS, {
        "run": str(RUN_FILE), "minutes": MINUTES, "eval_questions": rows[0]["questions"],
        "target_points": TARGET_POINTS,
        "change_mean": statistics.mean(changes), "change_sd": spread,
        "beyond_noise": beyond, "reading_rose": reading, "keep_best_gains": gains,
        "seeds": rows,
    })  # fmt: skip
    # A benchmark reports; the only checks are that every run produced its figures.
    assert all(r["versions"][1] >= r["versions"][0] for r in rows)  # type: ignore[index]
