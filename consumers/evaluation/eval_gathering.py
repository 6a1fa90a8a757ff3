"""The state the evaluation processor keeps per evaluation, and how one sample changes it.

Two kinds of table entries, both of bounded size whatever the benchmark's size:
- an `EvalTally` per evaluation of one benchmark (the eval key): running sums for Avg@k, the
  sum of per-question bests for Pass@k, and how many questions are complete;
- a `QuestionSamples` per question of it: its samples until the question has all of them (at
  most its group size), then only their trajectory ids, so a replay still counts once.

A question's best-of-k is added to the tally when its last sample arrives, so a new sample costs
one small read and write of each entry, not a rewrite of the whole evaluation (a table value
that grew with the benchmark passed faust's 1 MB record limit at about 4,000 samples).
`add_sample` is pure; `count_sample` reads and writes the entries, as JSON text, in any two
string mappings: the processor's faust tables, or dicts in tests and benchmarks.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import msgspec

from asearcher.consumers.evaluation.eval_scores import COUNTS, SCORES, SampleScores, aggregate
from asearcher.streams.wire.events import WEIGHTS_OF_KEY, EvalResult, TrajectoryFinished


class Sum(msgspec.Struct, array_like=True):
    """A running total and how many values it holds."""

    total: float = 0.0
    count: int = 0

    def add(self, value: float) -> None:
        self.total += value
        self.count += 1


class EvalTally(msgspec.Struct, kw_only=True):
    """One evaluation of one benchmark, summed up so far."""

    eval_id: str
    benchmark: str
    questions: int  # how many questions the evaluation asked
    model: str = ""
    versions: list[int] = []  # the weight versions its tokens came from (one, when pinned)
    k: int = 0  # the largest group size seen
    averages: dict[str, Sum] = {}  # score or count -> its sum over every sample
    best: dict[str, Sum] = {}  # score -> the sum of complete questions' bests
    questions_done: int = 0
    samples: int = 0  # samples counted
    done: bool = False

    def result(self) -> EvalResult:
        """The `EvalResult` of what has been counted."""
        return EvalResult(
            eval_id=self.eval_id, model=self.model, benchmark=self.benchmark,
            policy_version=self.versions[0] if len(self.versions) == 1 else -1,
            questions=self.questions_done, samples_per_question=self.k,
            averages=_means(self.averages), best_of_k=_means(self.best),
        )  # fmt: skip


class QuestionSamples(msgspec.Struct, kw_only=True):
    """One question of an evaluation: its samples until complete, then only their ids."""

    group_size: int
    samples: list[SampleScores] = []
    counted: list[str] = []  # trajectory ids once complete (samples are then dropped)

    def has(self, trajectory_id: str) -> bool:
        return trajectory_id in self.counted or any(
            s.trajectory_id == trajectory_id for s in self.samples
        )

    @property
    def complete(self) -> bool:
        return bool(self.counted)


class Step(msgspec.Struct, kw_only=True):
    """What one sample did: the entries to write back (None: unchanged) and a finished result."""

    tally: EvalTally | None = None
    question: QuestionSamples | None = None
    result: EvalResult | None = None


def new_tally(trajectory: TrajectoryFinished) -> EvalTally:
    """The empty tally of the evaluation `trajectory` belongs to (its metadata is checked)."""
    metadata = trajectory.metadata
    model = metadata.get(WEIGHTS_OF_KEY) or metadata.get("model", "")
    return EvalTally(
        eval_id=metadata["eval_id"], benchmark=metadata["benchmark"],
        questions=int(metadata["questions"]), model=model,
    )  # fmt: skip


def generated_versions(trajectory: TrajectoryFinished) -> set[int]:
    """The weight versions of the tokens the policy generated in `trajectory`."""
    pairs = zip(trajectory.token_versions, trajectory.loss_mask, strict=False)
    return {version for version, generated in pairs if generated}


def add_sample(
    tally: EvalTally,
    question: QuestionSamples | None,
    trajectory: TrajectoryFinished,
    sample: SampleScores,
) -> Step:
    """Count `sample` (of `trajectory`) once; an empty Step when it was counted already, its
    question is complete, or the evaluation is done."""
    if question is None:
        question = QuestionSamples(group_size=trajectory.group_size)
    if tally.done or question.complete or question.has(sample.trajectory_id):
        return Step()
    question.samples.append(sample)
    tally.samples += 1
    tally.k = max(tally.k, question.group_size)
    tally.versions = sorted(set(tally.versions) | generated_versions(trajectory))
    for name in SCORES:
        if name in sample.scores:
            tally.averages.setdefault(name, Sum()).add(sample.scores[name])
    for name in COUNTS:
        tally.averages.setdefault(name, Sum()).add(sample.counts[name])
    if len(question.samples) >= question.group_size:
        _complete(tally, question)
    step = Step(tally=tally, question=question)
    if tally.questions_done >= tally.questions:
        tally.done = True
        step.result = tally.result()
    return step


_ENCODER = msgspec.json.Encoder()
_TALLY = msgspec.json.Decoder(EvalTally)
_QUESTION = msgspec.json.Decoder(QuestionSamples)


def question_key(eval_key: str, question_id: str) -> str:
    """The key of one question of one evaluation (unambiguous whatever the ids hold)."""
    return _ENCODER.encode([eval_key, question_id]).decode()


def count_sample(
    tallies: MutableMapping[str, str],
    questions: MutableMapping[str, str],
    trajectory: TrajectoryFinished,
    sample: SampleScores,
) -> EvalResult | None:
    """`add_sample` on the entries of `trajectory`'s evaluation and question, read from and
    written back to the two mappings; the evaluation's result when this sample completed it."""
    key = trajectory.eval_key
    q_key = question_key(key, trajectory.question_id)
    raw_tally, raw_question = tallies.get(key), questions.get(q_key)
    step = add_sample(
        _TALLY.decode(raw_tally) if raw_tally is not None else new_tally(trajectory),
        _QUESTION.decode(raw_question) if raw_question is not None else None,
        trajectory,
        sample,
    )
    if step.question is not None:
        questions[q_key] = _ENCODER.encode(step.question).decode()
    if step.tally is not None:
        tallies[key] = _ENCODER.encode(step.tally).decode()
    return step.result


def _complete(tally: EvalTally, question: QuestionSamples) -> None:
    """Add the question's best of its samples to the tally and keep only their ids."""
    _, best = aggregate(question.samples, question.group_size)
    for name, value in best.items():
        tally.best.setdefault(name, Sum()).add(value)
    tally.questions_done += 1
    question.counted = [s.trajectory_id for s in question.samples]
    question.samples = []


def _means(sums: dict[str, Sum]) -> dict[str, float]:
    return {name: s.total / s.count for name, s in sums.items() if s.count}
