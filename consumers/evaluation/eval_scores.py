"""Scores of evaluation trajectories: per sample, Avg@k / Pass@k per benchmark, tables, records.

A benchmark evaluated with k samples per question yields k `TrajectoryFinished` events per
question. `sample_of` reads one into `SampleScores` (its scores from `reward_parts`, its counts
from the token mask, tool calls and turns); `aggregate` turns them into the two maps of an
`EvalResult`: Avg@k, the flat mean over every (question, sample), and Pass@k, the mean over
questions of the best of each question's first k samples. `render_table` prints results the way
the reference evaluation does, and `question_records` / `write_jsonl` keep per-question detail.
`change_noise` bounds the noise of a change between two evaluations from their averages alone;
`paired_change_noise` measures it from each question's mean before and after (`question_means`).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import fsspec
import msgspec
from fsspec.implementations.local import LocalFileSystem
from rich.table import Table

from asearcher.consumers.evaluation.benchmarks import BenchmarkQuestion
from asearcher.streams.wire.events import EvalResult, TrajectoryFinished

SCORES = ("f1", "em", "cem", "format", "judge")
COUNTS = ("gen_len", "searches", "accesses", "turns")

# Table headers of the scores and counts shown, in column order ("format" is not shown).
SCORE_HEADERS = {"f1": "F1", "em": "EM", "cem": "CEM", "judge": "judge"}
COUNT_HEADERS = {
    "gen_len": "avg_gen_len",
    "searches": "searches",
    "accesses": "accesses",
    "turns": "turns",
}


class SampleScores(msgspec.Struct, frozen=True, kw_only=True):
    """What one evaluation trajectory scored and how much work it took."""

    trajectory_id: str
    question_id: str
    sample_index: int  # which member of its group (Pass@k takes the first k)
    scores: dict[str, float]
    counts: dict[str, float]


def sample_of(t: TrajectoryFinished) -> SampleScores:
    """The scores (those of SCORES in `reward_parts`) and counts of one trajectory.

    ValueError naming the field for a score outside [0, 1] or a count that is negative or not
    finite: one bad sample must not quietly skew a benchmark's averages.
    """
    scores = {name: t.reward_parts[name] for name in SCORES if name in t.reward_parts}
    for name, value in scores.items():
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ValueError(
                f"trajectory {t.trajectory_id}: reward_parts[{name!r}] = {value!r} "
                "is not a score in [0, 1]"
            )
    fields = {
        "gen_len": ("loss_mask", float(sum(t.loss_mask))),
        "searches": ("tool_calls['search']", float(t.tool_calls.get("search", 0))),
        "accesses": ("tool_calls['browse']", float(t.tool_calls.get("browse", 0))),
        "turns": ("num_turns", float(t.num_turns)),
    }
    for field, value in fields.values():
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"trajectory {t.trajectory_id}: {field} gives {value!r}, not >= 0")
    return SampleScores(
        trajectory_id=t.trajectory_id,
        question_id=t.question_id,
        sample_index=t.sample_index,
        scores=scores,
        counts={name: value for name, (_, value) in fields.items()},
    )


def aggregate(samples: Iterable[SampleScores], k: int) -> tuple[dict[str, float], dict[str, float]]:
    """(averages, best_of_k) of one benchmark: Avg@k and Pass@k, as `EvalResult` holds them.

    averages: the mean of every score and count over all samples (a score some samples lack,
    such as "judge", over those that have it). best_of_k: per score, the mean over questions of
    the best among each question's first k samples (smallest sample index, then trajectory id);
    questions whose first k samples all lack the score are left out of that mean.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    samples = list(samples)
    if not samples:
        raise ValueError("no samples to aggregate")
    _check_unique(s.trajectory_id for s in samples)
    averages: dict[str, float] = {}
    for name in SCORES:
        values = [s.scores[name] for s in samples if name in s.scores]
        if values:
            averages[name] = _mean(values)
    for name in COUNTS:
        averages[name] = _mean([s.counts[name] for s in samples])
    best: dict[str, list[float]] = defaultdict(list)
    for group in _by_question(samples).values():
        first = sorted(group, key=_sample_order)[:k]
        for name in SCORES:
            values = [s.scores[name] for s in first if name in s.scores]
            if values:
                best[name].append(max(values))
    best_of_k = {name: _mean(best[name]) for name in SCORES if best[name]}
    return averages, best_of_k


# ---------------------------------------------------------------- table


@dataclass(frozen=True, slots=True)
class _Column:
    """One numeric table column: its header, how to read a result, how many decimals."""

    header: str
    value: Callable[[EvalResult], float | None]
    decimals: int


def render_table(results: list[EvalResult]) -> Table:
    """One row per result and, with more than one, an "average" row (mean of each column).

    Scores are fractions with 3 decimals, as the reference prints them; counts have 2. The
    judge columns appear only when some result was judged; a cell a result lacks shows "-".
    """
    columns = _columns(results)
    table = Table(title="evaluation")
    table.add_column("benchmark")
    table.add_column("version", justify="right")
    for column in columns:
        table.add_column(column.header, justify="right")
    for result in results:
        cells = [_cell(column.value(result), column.decimals) for column in columns]
        table.add_row(result.benchmark, str(result.policy_version), *cells)
    if len(results) > 1:
        versions = {r.policy_version for r in results}
        version = str(versions.pop()) if len(versions) == 1 else "-"
        cells = [_cell(_column_mean(results, c), max(c.decimals, 1)) for c in columns]
        table.add_section()
        table.add_row("average", version, *cells)
    return table


def _columns(results: list[EvalResult]) -> list[_Column]:
    """The numeric columns for `results`, in the reference's order."""
    judged = any("judge" in r.averages or "judge" in r.best_of_k for r in results)
    scores = [name for name in SCORE_HEADERS if name != "judge" or judged]
    ks = sorted({r.samples_per_question for r in results})
    # One k goes in the headers; mixed ks get a column of their own.
    k_label = str(ks[0]) if len(ks) == 1 else "k"
    columns = [_Column("num", lambda r: float(r.questions), 0)]
    if len(ks) > 1:
        columns.append(_Column("k", lambda r: float(r.samples_per_question), 0))
    columns += [_Column(COUNT_HEADERS[n], _reader("averages", n), 2) for n in COUNT_HEADERS]
    columns += [_Column(SCORE_HEADERS[n], _reader("averages", n), 3) for n in scores]
    columns += [
        _Column(f"{SCORE_HEADERS[n]} Pass@{k_label}", _reader("best_of_k", n), 3) for n in scores
    ]
    return columns


def _reader(field: str, name: str) -> Callable[[EvalResult], float | None]:
    """Reads `name` from a result's `averages` or `best_of_k`."""
    return lambda result: getattr(result, field).get(name)


def _column_mean(results: list[EvalResult], column: _Column) -> float | None:
    """The mean of a column over the results that have a value in it."""
    values = [v for v in (column.value(r) for r in results) if v is not None]
    return _mean(values) if values else None


def _cell(value: float | None, decimals: int) -> str:
    """A table cell: "-" for a missing value."""
    return "-" if value is None else f"{value:.{decimals}f}"


# ---------------------------------------------------------------- per-question records


def question_records(
    questions: list[BenchmarkQuestion], trajectories: list[TrajectoryFinished]
) -> list[dict[str, Any]]:
    """One JSON-able record per question, in `questions` order, with its samples in order.

    A record holds what the reference writes per question (`id`, `question`, `gt`) and
    `samples`: per trajectory its `history` (the transcript), `pred_answer`, `num_turns`,
    `finish_reason`, `scores` and `counts`. ValueError for a trajectory of an unknown question.
    """
    known = {q.id for q in questions}
    _check_unique(t.trajectory_id for t in trajectories)
    by_question: dict[str, list[tuple[SampleScores, TrajectoryFinished]]] = defaultdict(list)
    for t in trajectories:
        if t.question_id not in known:
            raise ValueError(
                f"trajectory {t.trajectory_id} answers unknown question {t.question_id!r}"
            )
        by_question[t.question_id].append((sample_of(t), t))
    return [
        {
            "id": q.id,
            "question": q.question,
            "gt": list(q.answers),
            "samples": [
                _sample_record(s, t)
                for s, t in sorted(by_question[q.id], key=lambda pair: _sample_order(pair[0]))
            ],
        }
        for q in questions
    ]


def _sample_record(sample: SampleScores, t: TrajectoryFinished) -> dict[str, Any]:
    """The per-sample part of a question record."""
    return {
        "trajectory_id": t.trajectory_id,
        "sample_index": sample.sample_index,
        "history": list(t.transcript),
        "pred_answer": t.answer or "",
        "num_turns": t.num_turns,
        "finish_reason": t.finish_reason,
        "scores": dict(sample.scores),
        "counts": dict(sample.counts),
    }


def write_jsonl(url: str, records: list[dict[str, Any]]) -> None:
    """Write `records` as JSON lines to a path or fsspec URL (compression by extension)."""
    fs, path = fsspec.core.url_to_fs(url)
    if isinstance(fs, LocalFileSystem):
        fs.makedirs(os.path.dirname(path), exist_ok=True)
    data = msgspec.json.Encoder().encode_lines(records)
    with fsspec.open(url, "wb", compression="infer") as out:
        out.write(data)


# ---------------------------------------------------------------- helpers


def _sample_order(sample: SampleScores) -> tuple[bool, int, str]:
    """Known indices first, by index; samples without one by trajectory id."""
    return (sample.sample_index, sample.trajectory_id)


def _by_question(samples: list[SampleScores]) -> dict[str, list[SampleScores]]:
    """Samples grouped by question id."""
    groups: dict[str, list[SampleScores]] = defaultdict(list)
    for sample in samples:
        groups[sample.question_id].append(sample)
    return groups


def _check_unique(ids: Iterable[str]) -> None:
    """ValueError naming a trajectory id seen twice: a replayed trajectory must not count twice."""
    seen: set[str] = set()
    for tid in ids:
        if tid in seen:
            raise ValueError(f"trajectory {tid} appears twice")
        seen.add(tid)


def _mean(values: list[float]) -> float:
    """The exact-sum mean of a non-empty list."""
    return math.fsum(values) / len(values)


def change_noise(before: EvalResult, after: EvalResult, score: str) -> float:
    """Two standard errors of `after - before` in `score` (Avg@k), bounded from above.

    A question's mean score lies in [0, 1], so its variance is at most m (1 - m) for a mean m;
    over n questions the standard error of each mean is at most sqrt(m (1 - m) / n). The two
    evaluations are taken as independent, which overstates the noise of a paired comparison
    of the same questions, so a change beyond this bound is unlikely to be chance."""
    variance = 0.0
    for result in (before, after):
        m = min(max(result.averages.get(score, 0.0), 0.0), 1.0)
        variance += m * (1.0 - m) / max(result.questions, 1)
    return 2.0 * math.sqrt(variance)


def question_means(trajectories: Iterable[TrajectoryFinished]) -> dict[str, dict[str, float]]:
    """Per score and per count (searches, pages, ...), each question's mean over its samples:
    what a paired comparison of two evaluations of the same questions compares."""
    by_question = _by_question([sample_of(t) for t in trajectories])
    means: dict[str, dict[str, float]] = {}
    for name in SCORES + COUNTS:
        for question, samples in by_question.items():
            values = [
                s.scores[name] if name in SCORES else s.counts[name]
                for s in samples
                if name in s.scores or name in s.counts
            ]
            if values:
                means.setdefault(name, {})[question] = _mean(values)
    return means


def paired_change_noise(before: dict[str, float], after: dict[str, float]) -> float | None:
    """Two standard errors of the mean per-question change from `before` to `after` (each a
    question's mean score), over the questions both hold; None for fewer than two.

    The same questions asked before and after: what makes a question easy or hard for the
    policy cancels out of its change, so this is the noise of the comparison itself, smaller
    than `change_noise`'s bound whenever the two evaluations agree on which questions are hard."""
    shared = sorted(before.keys() & after.keys())
    if len(shared) < 2:
        return None
    changes = [after[q] - before[q] for q in shared]
    mean = _mean(changes)
    variance = math.fsum((c - mean) ** 2 for c in changes) / (len(changes) - 1)
    return 2.0 * math.sqrt(variance / len(changes))
