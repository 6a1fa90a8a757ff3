"""One run config describes a whole run; the settings services must agree on are derived here.

`RunConfig` (TOML) names the run, the model, the weight store, the data and, per service, a
replica count and that service's own config. `resolve` fills in what is derived (never matched by
hand): the producers' staleness bound and share from the trainer's batch and the producer count,
the model name every service uses, instance names, consumer groups, stores and paths. A derived
setting written in the file is refused with a line naming where it comes from.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from asearcher.cli.run.hosts import HostSection, check_hosts
from asearcher.cli.run.service_kinds import CLI_MODULE, SERVICE_KINDS, serve_command
from asearcher.consumers.evaluation.eval_processor import EvalProcessorConfig
from asearcher.consumers.observability.metrics_processor import metrics_app_id
from asearcher.consumers.tools.toolbox import ToolConfig
from asearcher.consumers.world.world import TEST_SHARE
from asearcher.producers.engines.registry import ENGINE_KINDS
from asearcher.producers.policy.model_init import PolicySpec
from asearcher.producers.rollout.feeder import FeederConfig
from asearcher.producers.rollout.service import RolloutConfig, RolloutTopics
from asearcher.producers.rollout.staleness import StalenessConfig
from asearcher.producers.synthesis.processor import SynthProcessorConfig
from asearcher.streams.service.config_file import load_config, read_config_file
from asearcher.streams.service.supervisor import Program
from asearcher.streams.wire.events import SamplingSettings
from asearcher.trainer.runtime.config import TrainerConfig

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
# What a service may take to stop after SIGTERM, beyond its own drain time.
STOP_MARGIN_S = 30.0
# Demonstration worlds are seeded from here: far from the small seeds runs use and from the
# reading worlds' (`producers/policy/reading.py`), so none of them is a run's world.
DEMONSTRATION_SEED = 2_000_000
MAX_DEMONSTRATION_WORLDS = 50


class DataConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What the run trains on and searches."""

    qa: Annotated[
        str | None,
        Meta(description="QA JSONL to train on; default: the synthetic world's train split"),
    ] = None
    index_dir: Annotated[
        str | None, Meta(description="local knowledge base; default: built over the world")
    ] = None
    world_entities: Annotated[
        int, Meta(description="size of the synthetic world built when qa/index are not given")
    ] = 300
    world_seed: Annotated[
        int, Meta(description="seed of the synthetic world (its entities, pages and questions)")
    ] = 0
    world_questions: Annotated[
        int, Meta(description="questions of the synthetic world (train and test splits)")
    ] = 500
    world_max_hops: Annotated[
        int, Meta(description="longest chain a question of the synthetic world asks about")
    ] = 4
    world_filler: Annotated[
        bool, Meta(description="pages with anecdotes around their facts (False: facts alone)")
    ] = True
    world_names_from: Annotated[
        int | None,
        Meta(
            description=(
                "seed of a world (of the same size) whose names this world's entities take, with"
                " their facts drawn afresh; None: names of its own"
            )
        ),
    ] = None
    world_max_answer_share: Annotated[
        float | None,
        Meta(
            description=(
                "leave out the synthetic world's questions of kinds whose commonest answer is"
                " that of more than this share of their chains (one country: every 'in which"
                " country' question is answered alike), so that guessing does not pay; None:"
                " every kind"
            )
        ),
    ] = None
    world_valid_share: Annotated[
        float,
        Meta(
            description=(
                "share of the synthetic world's questions kept out of training for validation"
                " (qa_valid.jsonl, taken from what would be train questions, the same share of"
                " each kind of question; the test split stays the same): what continuous"
                ' evaluation scores with eval.config.split = "valid"'
            )
        ),
    ] = 0.0
    world_test_share: Annotated[
        float,
        Meta(
            description=(
                "share of the synthetic world's questions held out (qa_test.jsonl), by a stable"
                " hash of their ids: a larger share holds out every question a smaller one does."
                " More held-out questions narrow the noise of a change in F1 by the square root"
                " of their number; the warm start's demonstration worlds keep the default fifth"
            )
        ),
    ] = TEST_SHARE
    dense: Annotated[bool, Meta(description="build the dense index too (hybrid search)")] = True

    def __post_init__(self) -> None:
        from asearcher.consumers.world.world import MAX_HOPS, MIN_ENTITIES

        share = self.world_max_answer_share
        if share is not None and not 0.0 < share <= 1.0:
            raise ValueError(f"data.world_max_answer_share must be within (0, 1], got {share}")
        if not 0.0 <= self.world_valid_share <= 0.5:
            raise ValueError(
                f"data.world_valid_share must be within [0, 0.5], got {self.world_valid_share}"
            )

        if not 0.05 <= self.world_test_share <= 0.5:
            raise ValueError(
                f"data.world_test_share must be within [0.05, 0.5], got {self.world_test_share}"
            )
        if self.world_valid_share + self.world_test_share > 0.8:
            raise ValueError(
                "data.world_valid_share + data.world_test_share must leave a fifth of the "
                f"questions to train on, got {self.world_valid_share + self.world_test_share:.2f}"
            )
        if not 1 <= self.world_max_hops <= MAX_HOPS:
            raise ValueError(f"data.world_max_hops must be within 1..{MAX_HOPS}")
        if self.world_entities < MIN_ENTITIES or self.world_questions < 1:
            raise ValueError(
                f"data.world_entities must be at least {MIN_ENTITIES} and world_questions at "
                "least 1"
            )

    def world_key(self) -> str:
        """The built world's directory name: its seed, size and, when not the default, knobs."""
        key = f"world-{self.world_seed}-{self.world_entities}"
        if (self.world_questions, self.world_max_hops, self.world_filler) != (500, 4, True):
            key += f"-q{self.world_questions}-h{self.world_max_hops}"
            key += "" if self.world_filler else "-brief"
        if self.world_names_from is not None:
            key += f"-names{self.world_names_from}"
        if self.world_max_answer_share is not None:
            key += f"-guess{round(self.world_max_answer_share * 100)}"
        if self.world_valid_share:
            # "kind": validation chosen per kind, not by hash as in worlds built before it.
            key += f"-kindvalid{round(self.world_valid_share * 100)}"
        if self.world_test_share != TEST_SHARE:
            key += f"-test{round(self.world_test_share * 100)}"
        return key


class ToolsSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Tool workers: search and browse."""

    replicas: Annotated[int, Meta(description="0: the tools run elsewhere")] = 1
    config: ToolConfig = msgspec.field(default_factory=lambda: ToolConfig(search_mode="bm25"))


class RolloutSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Rollout producers."""

    replicas: Annotated[
        int, Meta(description="producers; the staleness share of each is derived from this")
    ] = 1
    engine: Annotated[
        str, Meta(description="transformers | vllm | expert | endpoint (a workflow's own)")
    ] = "transformers"
    mistake_rate: Annotated[
        float, Meta(description="expert engine only: share of answers it gets wrong on purpose")
    ] = 0.0
    config: RolloutConfig = msgspec.field(default_factory=RolloutConfig)


class TrainerSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The trainer."""

    processes: Annotated[
        int,
        Meta(description="data-parallel processes (DeepSpeed's launcher); 0: it runs elsewhere"),
    ] = 1
    master_port: Annotated[
        int, Meta(description="the ranks' rendezvous port when processes > 1")
    ] = 29500
    config: TrainerConfig = msgspec.field(default_factory=TrainerConfig)


def _default_feeder() -> FeederConfig:
    # Short turns: the CPU policy writes at ~1,000 tokens/s on this machine's two cores.
    return FeederConfig(sampling=SamplingSettings(max_new_tokens_per_turn=128, max_turns=16))


class FeederSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The request feeder: the QA file as requests, epoch after epoch."""

    enabled: Annotated[
        bool, Meta(description="false: no feeder (requests come from elsewhere)")
    ] = True
    config: FeederConfig = msgspec.field(default_factory=_default_feeder)


def _default_eval() -> EvalProcessorConfig:
    return EvalProcessorConfig(
        every_versions=5, samples=2, limit=20,
        sampling=SamplingSettings(temperature=0.6, top_p=0.95, max_new_tokens_per_turn=128,
                                  max_turns=16),
    )  # fmt: skip


class EvalSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Continuous evaluation: evaluators (the rollout engine, pinned versions) and the
    evaluation processor, which asks for every Nth version on the held-out benchmarks."""

    replicas: Annotated[int, Meta(description="evaluators; 0: no evaluation in this run")] = 1
    concurrency: Annotated[int, Meta(description="trajectories each evaluator plays at once")] = 8
    engine: Annotated[
        str,
        Meta(
            description=(
                'The evaluators\' engine ("": the rollout engine). E.g. "transformers" to '
                "measure the policy itself while an expert plays the training groups."
            )
        ),
    ] = ""
    keep_best: Annotated[
        bool,
        Meta(
            description=(
                "`learn` scores, after RL, the latest version its continuous evaluations rate"
                " within one standard error of the best (each with its neighbours, so that one"
                " lucky score does not decide), not the last; they must be of the validation"
                ' split (config.split = "valid"), never of the held-out questions it is then'
                " scored on"
            )
        ),
    ] = False
    config: EvalProcessorConfig = msgspec.field(default_factory=_default_eval)


class SynthSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Data synthesis as a service of the run: processors that synthesize the run's seeds on
    `synth.requests` (`asearcher synth run --external` sends them as the run's job), reading
    pages through the run's tool workers."""

    replicas: Annotated[int, Meta(description="synthesis processors; 0: none in this run")] = 0
    config: SynthProcessorConfig = msgspec.field(default_factory=SynthProcessorConfig)


class WarmStartSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Behaviour cloning before RL: `stream up` has the scripted expert play train questions and
    clones its trajectories into the run's first version, when the run has announced none yet.

    With `worlds` > 0 the expert plays the train questions of that many synthetic worlds other
    than the run's (seeded from `DEMONSTRATION_SEED`, shaped like the run's), and the policy's
    tokenizer and pretraining read those worlds too: no fact of the run's world is seen before
    RL, so RL on its train split pays for reading, not for recalling cloned answers. With 0 it
    plays the run's own train split."""

    enabled: Annotated[
        bool,
        Meta(description="clone a demonstrator into v1 before RL when the run has no version yet"),
    ] = False
    worlds: Annotated[
        int,
        Meta(description="demonstration worlds other than the run's (0: the run's train split)"),
    ] = 0
    world_entities: Annotated[
        int | None,
        Meta(
            description=(
                "Their size (None: the run's world's). Many entities mean many names: copying"
                " the names a question and a page show then pays, reciting names seen in "
                "cloning does not."
            )
        ),
    ] = None
    world_questions: Annotated[
        int | None,
        Meta(description="questions of each demonstration world (None: the run's world's)"),
    ] = None
    borrow_names: Annotated[
        bool,
        Meta(
            description=(
                "the demonstration worlds carry the run's names (people, places, companies,"
                " rivers) with other facts: names the policy copies well, answers it cannot recall"
            )
        ),
    ] = False
    shortcut_rate: Annotated[
        float, Meta(description="how often the expert answers instead of opening the next page")
    ] = 0.0
    quote_evidence: Annotated[
        bool,
        Meta(
            description=(
                "the expert's note on each page copies the sentence that holds what it acts on"
                " (the link it follows or the answer), not the link or answer alone"
            )
        ),
    ] = False
    cue_evidence: Annotated[
        bool,
        Meta(
            description=(
                "the expert's note on each observation is the shortest run of its words that "
                "leads to what it acts on, then that link or answer as written"
            )
        ),
    ] = False
    max_hops: Annotated[
        int | None, Meta(description="demonstrate only questions of at most this many hops")
    ] = None
    questions: Annotated[
        int | None, Meta(description="at most this many questions per world (None: every one)")
    ] = None
    epochs: Annotated[
        int, Meta(description="passes of behaviour cloning over the demonstrations")
    ] = 4
    batch: Annotated[int, Meta(description="trajectories per optimiser step")] = 8
    lr: Annotated[
        float,
        Meta(
            description=(
                "learning rate of behaviour cloning (3e-3 wiped out the small policy's copying "
                "from its context, 85 % to 1 %; 5e-4 keeps 64 %: docs/learning.md)"
            )
        ),
    ] = 5e-4
    lr_decay: Annotated[
        bool,
        Meta(
            description=(
                "the cloning rate warms up over 5 % of the steps, then falls linearly to 0 (at "
                "the recipe's 5e-4 it left clones under-trained, F1 0.03-0.08 where the "
                "constant rate's scored 0.11-0.21: docs/learning.md)"
            )
        ),
    ] = False
    orders: Annotated[
        int,
        Meta(
            description=(
                "clone this many times, each with its own shuffle order, and keep the clone "
                "that answers best on the demonstration worlds' held-out questions (clones of "
                "one run's demonstrations scored 0.13-0.23 F1 by order: docs/learning.md)"
            )
        ),
    ] = 1
    snapshots: Annotated[
        int,
        Meta(
            description=(
                "score each clone at this many steps of its last epoch, evenly spaced and "
                "ending with its last step, and keep the snapshot that answers best (snapshots "
                "scored as far apart as orders, but the run's questions did not rank them alike:"
                " docs/learning.md)"
            )
        ),
    ] = 1
    selection_questions: Annotated[
        int | None,
        Meta(description="held-out questions of each demonstration world that score an order"),
    ] = None
    keep_clone: Annotated[
        bool,
        Meta(
            description=(
                "keep the clone in this machine's cache ($ASEARCHER_CACHE/clones) under a "
                "digest of everything that makes it, and announce the kept one in a later run "
                "whose policy, demonstrations, settings and code digest alike instead of "
                "cloning again (the same inputs clone alike: docs/learning.md)"
            )
        ),
    ] = False

    def __post_init__(self) -> None:
        if self.orders < 1:
            raise ValueError(f"warm_start.orders must be at least 1, got {self.orders}")
        if self.snapshots < 1:
            raise ValueError(f"warm_start.snapshots must be at least 1, got {self.snapshots}")
        for name in ("orders", "snapshots"):
            if getattr(self, name) > 1 and not self.worlds:
                raise ValueError(
                    f"warm_start.{name} > 1 needs demonstration worlds (worlds >= 1): clones "
                    "are chosen on their held-out questions, never on the run's world"
                )
        if self.selection_questions is not None and self.selection_questions < 1:
            raise ValueError(
                f"warm_start.selection_questions must be at least 1, got {self.selection_questions}"
            )
        if self.max_hops is not None and self.max_hops < 1:
            raise ValueError(f"warm_start.max_hops must be at least 1, got {self.max_hops}")
        if self.questions is not None and self.questions < 1:
            raise ValueError(f"warm_start.questions must be at least 1, got {self.questions}")
        if self.epochs < 1 or self.batch < 1:
            raise ValueError("warm_start.epochs and warm_start.batch must be at least 1")
        if not 0.0 < self.lr < 1.0:
            raise ValueError(f"warm_start.lr must be in (0, 1), got {self.lr}")
        if not 0 <= self.worlds <= MAX_DEMONSTRATION_WORLDS:
            raise ValueError(
                f"warm_start.worlds must be within 0..{MAX_DEMONSTRATION_WORLDS}, got {self.worlds}"
            )
        for name in ("world_entities", "world_questions"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"warm_start.{name} must be at least 1, got {getattr(self, name)}")
        if self.borrow_names and not self.worlds:
            raise ValueError("warm_start.borrow_names needs demonstration worlds (worlds >= 1)")
        if not 0.0 <= self.shortcut_rate < 1.0:
            raise ValueError(
                f"warm_start.shortcut_rate must be in [0, 1), got {self.shortcut_rate}"
            )

    @property
    def min_reward(self) -> float:
        """What a demonstration must score to be cloned: with shortcuts, every one (the habit
        is what is taught), else only right ones."""
        return 0.0 if self.shortcut_rate else 1.0


class MetricsSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The metrics processor: training and evaluation curves as TensorBoard event files in
    <run dir>/tensorboard."""

    enabled: Annotated[bool, Meta(description="false: no TensorBoard files for this run")] = True


class RunConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A whole run. Every field has a default: the embedded run works on one machine."""

    name: Annotated[
        str, Meta(description="names the run: model on the weights topic, groups, directory")
    ] = "default"
    model_dir: Annotated[
        str | None,
        Meta(description="the initial policy; default <home>/model (created if missing)"),
    ] = None
    policy: Annotated[PolicySpec, Meta(description="the policy model_init makes")] = msgspec.field(
        default_factory=PolicySpec
    )
    store: Annotated[
        str | None, Meta(description="weight store URL; default <home>/runs/<name>/weights")
    ] = None
    log_level: Annotated[
        str, Meta(description="log level of every service (DEBUG, INFO, WARNING, ERROR)")
    ] = "INFO"
    brokers: Annotated[
        int | None,
        Meta(
            description="nodes of the local Kafka cluster `stream up` formats (3: topics "
            "replicated 3 times, min.insync.replicas 2); default 1, or what the home's cluster "
            "was formatted with; not used with --bootstrap-servers"
        ),
    ] = None
    claims: Annotated[
        str | None,
        Meta(
            description="claim-check store URL (payloads too large for a record); default "
            "<home>/runs/<name>/claims; a run over several hosts needs a shared one (s3://)"
        ),
    ] = None
    hosts: Annotated[
        dict[str, HostSection],
        Meta(
            description="a run over several machines: each host's share of the services "
            "(`stream up --host NAME`); empty: everything on the machine that runs `stream up`"
        ),
    ] = {}
    data: DataConfig = msgspec.field(default_factory=DataConfig)
    tools: ToolsSection = msgspec.field(default_factory=ToolsSection)
    rollout: RolloutSection = msgspec.field(default_factory=RolloutSection)
    trainer: TrainerSection = msgspec.field(default_factory=TrainerSection)
    feeder: FeederSection = msgspec.field(default_factory=FeederSection)
    eval: EvalSection = msgspec.field(default_factory=EvalSection)
    metrics: MetricsSection = msgspec.field(default_factory=MetricsSection)
    warm_start: WarmStartSection = msgspec.field(default_factory=WarmStartSection)
    synth: SynthSection = msgspec.field(default_factory=SynthSection)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"name {self.name!r}: letters, digits, '-' and '_' only")
        for field, value in (
            ("tools.replicas", self.tools.replicas),
            ("rollout.replicas", self.rollout.replicas),
            ("trainer.processes", self.trainer.processes),
            ("eval.replicas", self.eval.replicas),
            ("synth.replicas", self.synth.replicas),
        ):
            if not 0 <= value <= 256:
                raise ValueError(f"{field} must be within 0..256, got {value}")
        if self.brokers is not None and not 1 <= self.brokers <= 7:
            raise ValueError(f"brokers must be within 1..7, got {self.brokers}")
        if self.rollout.engine not in ENGINE_KINDS:
            raise ValueError(f"rollout.engine must be one of {', '.join(ENGINE_KINDS)}")
        if self.eval.engine and self.eval.engine not in ENGINE_KINDS:
            raise ValueError(f"eval.engine must be empty or one of {', '.join(ENGINE_KINDS)}")
        if self.warm_start.enabled and self.data.qa is not None:
            raise ValueError(
                "warm_start needs the synthetic world (its expert knows the answers), not "
                "data.qa: clone your own demonstrations with `asearcher sft --topic`"
            )
        check_hosts(self)
        self._check_validation()
        sizes = (self.warm_start.world_entities, self.data.world_entities)
        if self.warm_start.borrow_names and sizes[0] not in (None, sizes[1]):
            raise ValueError(
                "warm_start.borrow_names needs demonstration worlds of the run's size: "
                f"warm_start.world_entities {sizes[0]} is not data.world_entities {sizes[1]}"
            )

    def _check_validation(self) -> None:
        split, world_has_one = self.eval.config.split, bool(self.data.world_valid_share)
        if split == "valid" and not world_has_one and self.data.qa is None:
            raise ValueError(
                'eval.config.split is "valid" but data.world_valid_share is 0: the synthetic '
                "world keeps no validation questions"
            )
        if self.eval.keep_best and split != "valid":
            raise ValueError(
                f"eval.keep_best chooses by continuous evaluations of eval.config.split "
                f'{split!r}: it must be "valid", or the held-out questions would choose the '
                "version they then score"
            )


def load_run_config(path: Path | None) -> RunConfig:
    """The run config in TOML file `path`, or the embedded defaults."""
    if path is not None:
        raw = read_config_file(path, "run config")
        try:
            _refuse_derived_keys(raw)
        except ValueError as exc:
            raise ValueError(f"run config {path}: {exc}") from exc
    return load_config(RunConfig, "run config", path)


class Paths(msgspec.Struct, frozen=True, kw_only=True):
    """Where a run keeps its things."""

    home: Path
    run_dir: Path
    model_dir: Path
    store: str
    claims: str
    qa: Path
    index_dir: Path
    world_dir: Path
    # The worlds the warm start's expert plays when they are not the run's (`warm_start.worlds`).
    demonstration_worlds: tuple[Path, ...] = ()

    @property
    def configs(self) -> Path:
        return configs_dir(self.run_dir)


def configs_dir(directory: Path) -> Path:
    """Where the run in `directory` keeps the configs `stream up` wrote for it."""
    return directory / "config"


def run_dir(home: Path, name: str) -> Path:
    """The directory of run `name`: configs, logs, weights, tool results, supervisor."""
    return home / "runs" / name


def paths(config: RunConfig, home: Path) -> Paths:
    """The run's directories and URLs, defaults filled in."""
    directory = run_dir(home, config.name)
    world = home / "build" / config.data.world_key()
    demonstrations = tuple(home / "build" / data.world_key() for data in demonstration_data(config))
    return Paths(
        home=home, run_dir=directory,
        model_dir=_model_dir(config, home, world, demonstrations),
        store=config.store or (directory / "weights").as_uri(),
        claims=config.claims or (directory / "claims").as_uri(),
        qa=Path(config.data.qa).expanduser() if config.data.qa else world / "qa_train.jsonl",
        index_dir=(
            Path(config.data.index_dir).expanduser() if config.data.index_dir else world / "index"
        ),
        world_dir=world, demonstration_worlds=demonstrations,
    )  # fmt: skip


def demonstration_data(config: RunConfig) -> list[DataConfig]:
    """The synthetic worlds the warm start demonstrates on when they are not the run's: shaped
    like the run's world (in the size `warm_start` asks for), seeded apart from it."""
    section, data = config.warm_start, config.data
    if not section.enabled:
        return []
    shape = msgspec.structs.replace(
        data, qa=None, index_dir=None, world_valid_share=0.0, world_test_share=TEST_SHARE,
        world_entities=section.world_entities or data.world_entities,
        world_questions=section.world_questions or data.world_questions,
        world_names_from=data.world_seed if section.borrow_names else None,
    )  # fmt: skip
    return [
        msgspec.structs.replace(shape, world_seed=DEMONSTRATION_SEED + i)
        for i in range(section.worlds)
    ]


def _model_dir(
    config: RunConfig, home: Path, world: Path, demonstrations: tuple[Path, ...]
) -> Path:
    """The initial policy: the configured one; else, with demonstration worlds, one per shape
    beside them (its tokenizer and pretraining read those worlds, never the run's); else
    `<home>/model` for the default shape, else one per shape inside the world it was made for
    (its tokenizer is trained on that world)."""
    if config.model_dir:
        return Path(config.model_dir).expanduser()
    if demonstrations:
        # Named by the worlds' pages, which it read; their questions it never saw.
        pages = msgspec.structs.replace(demonstration_data(config)[0], world_max_answer_share=None)
        return demonstrations[0].with_name(
            f"{pages.world_key()}-x{len(demonstrations)}-policy-{config.policy.key()}"
        )
    if config.policy == PolicySpec():
        return home / "model"
    return world / f"policy-{config.policy.key()}"


class Resolved(msgspec.Struct, frozen=True, kw_only=True):
    """Each service's config with every derived setting filled in."""

    tools: ToolConfig
    rollout: list[RolloutConfig]  # one per replica
    trainer: TrainerConfig
    feeder: FeederConfig
    evaluator: RolloutConfig  # each evaluator's (one consumer group)
    eval_processor: EvalProcessorConfig
    synth_processor: SynthProcessorConfig


def groups(name: str) -> dict[str, str]:
    """The consumer group of each service of run `name`."""
    kinds = ("tools", "rollout", "trainer", "evaluators")
    return {kind: f"asearcher-{name}-{kind}" for kind in kinds}


def app_ids(name: str) -> dict[str, str]:
    """The app id of each stream processor of run `name`: its consumer group, and the prefix
    of its transactional ids (and of the topics a faust app creates for itself)."""
    return {
        "eval-processor": f"asearcher-{name}-eval",
        "metrics": metrics_app_id(name),
        "synth": f"asearcher-{name}-synth",
    }


def resolve(config: RunConfig, where: Paths) -> Resolved:
    """Every service's config, derived settings filled in; ValueError if a file sets one."""
    _refuse_derived(config)
    name, trainer = config.name, config.trainer.config
    group_size = config.feeder.config.group_size
    if trainer.batching.min_group_size > group_size:
        raise ValueError(
            f"trainer.config.batching.min_group_size ({trainer.batching.min_group_size}) exceeds "
            f"feeder.config.group_size ({group_size}): no group could ever be trained"
        )
    if config.rollout.replicas > trainer.batching.groups_per_batch:
        raise ValueError(
            f"rollout.replicas ({config.rollout.replicas}) exceeds trainer.config.batching."
            f"groups_per_batch ({trainer.batching.groups_per_batch}): a producer would get no "
            "share of a batch"
        )
    rollouts = [
        msgspec.structs.replace(
            config.rollout.config,
            model=name,
            tool_pool=name,
            instance=f"{name}-rollout-{index}",
            group_id=groups(name)["rollout"],
            store=where.store,
            staleness=StalenessConfig(
                eta=trainer.batching.eta,
                batch_groups=trainer.batching.groups_per_batch,
                producers=config.rollout.replicas,
                producer_index=index,
            ),
        )  # fmt: skip
        for index in range(config.rollout.replicas)
    ]
    return Resolved(
        tools=msgspec.structs.replace(
            config.tools.config, index_dir=str(where.index_dir), pool=name
        ),
        rollout=rollouts,
        trainer=msgspec.structs.replace(
            trainer,
            model=name,
            instance=f"{name}-trainer",
            group_id=groups(name)["trainer"],
            model_dir=str(where.model_dir),
            store=where.store,
        ),  # fmt: skip
        feeder=msgspec.structs.replace(
            config.feeder.config, qa=str(where.qa), run=name, instance=f"{name}-feeder"
        ),
        evaluator=msgspec.structs.replace(
            config.rollout.config,
            mode="eval",
            model=name,
            tool_pool=name,
            group_id=groups(name)["evaluators"],
            store=where.store,
            concurrency=config.eval.concurrency,
            topics=RolloutTopics.for_eval(),
            staleness=StalenessConfig(enabled=False),
        ),
        eval_processor=msgspec.structs.replace(
            config.eval.config,
            app_id=app_ids(name)["eval-processor"],
            model=name,
            world_dir=str(where.world_dir),
            evaluator=groups(name)["evaluators"],
            every_versions=config.eval.config.every_versions if config.eval.replicas else 0,
        ),
        synth_processor=msgspec.structs.replace(
            config.synth.config,
            app_id=app_ids(name)["synth"],
            job=name,
            tool_pool=name,
            world_seed=config.data.world_seed,
            world_entities=config.data.world_entities,
        ),  # fmt: skip
    )


# Settings a run derives (dotted path in the run config -> where it comes from).
DERIVED: dict[str, str] = {
    "rollout.config.staleness": "trainer.config.batching (eta, groups_per_batch) and "
    "rollout.replicas",
    "rollout.config.model": "name",
    "rollout.config.tool_pool": "name",
    "rollout.config.instance": "name and the replica number",
    "rollout.config.group_id": "name",
    "rollout.config.store": "store",
    "trainer.config.model": "name",
    "trainer.config.instance": "name",
    "trainer.config.group_id": "name",
    "trainer.config.store": "store",
    "trainer.config.model_dir": "model_dir",
    "tools.config.index_dir": "data.index_dir",
    "tools.config.pool": "name",
    "feeder.config.qa": "data.qa",
    "feeder.config.run": "name",
    "feeder.config.instance": "name",
    "eval.config.app_id": "name",
    "eval.config.model": "name",
    "eval.config.world_dir": "data.world_entities and data.world_seed",
    "eval.config.evaluator": "name",
    "synth.config.app_id": "name",
    "synth.config.job": "name",
    "synth.config.tool_pool": "name",
    "synth.config.world_seed": "data.world_seed",
    "synth.config.world_entities": "data.world_entities",
}


def _refuse_derived(config: RunConfig) -> None:
    """A derived setting given a value of its own would silently disagree: refuse it."""
    default = RunConfig()
    for path, source in DERIVED.items():
        if _get(config, path) != _get(default, path):
            raise ValueError(f"{path} is derived from {source}: set that instead")


def _refuse_derived_keys(raw: dict[str, Any]) -> None:
    """The same for a file that writes a derived setting, even with its default value."""
    for path, source in DERIVED.items():
        table: Any = raw
        for part in path.split("."):
            table = table.get(part) if isinstance(table, dict) else None
        if table is not None:
            raise ValueError(f"{path} is derived from {source}: set that instead")


def _get(config: Any, path: str) -> Any:
    for part in path.split("."):
        config = getattr(config, part)
    return config


RUN_CONFIG_FILE = "run.json"  # in a run's config directory: the run config it was brought up with


def write_run_config(config: RunConfig, where: Paths) -> Path:
    """The run config as `stream up` used it, for commands that name the run (`ask --run`)."""
    where.configs.mkdir(parents=True, exist_ok=True)
    path = where.configs / RUN_CONFIG_FILE
    path.write_bytes(msgspec.json.format(msgspec.json.encode(config)))
    return path


def saved_run_config(home: Path, name: str) -> RunConfig:
    """The run config run `name` was last brought up with under `home`."""
    path = configs_dir(run_dir(home, name)) / RUN_CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"run {name!r} has not been brought up under {home} (no {path})")
    return msgspec.json.decode(path.read_bytes(), type=RunConfig)


def saved_claim_stores(home: Path) -> list[str]:
    """The claim-check stores named by the configs of the runs brought up under `home` (a run
    over several hosts keeps its claims in a shared one, not in its run directory)."""
    runs = home / "runs"
    saved = sorted(runs.glob(f"*/{configs_dir(Path()).name}/{RUN_CONFIG_FILE}"))
    stores = []
    for path in saved if runs.is_dir() else []:
        try:
            claims = msgspec.json.decode(path.read_bytes(), type=RunConfig).claims
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
            continue  # an older or damaged file: its run's claims are in its run directory
        if claims:
            stores.append(claims)
    return stores


def write_service_configs(resolved: Resolved, where: Paths) -> dict[str, Path]:
    """Each service's resolved config as JSON under the run directory; path by program."""
    where.configs.mkdir(parents=True, exist_ok=True)
    files = {
        "tools": resolved.tools,
        "trainer": resolved.trainer,
        "feeder": resolved.feeder,
        "evaluator": resolved.evaluator,
        "eval-processor": resolved.eval_processor,
        "synth-processor": resolved.synth_processor,
        **{f"rollout-{i}": config for i, config in enumerate(resolved.rollout)},
    }
    written = {}
    for program, config in files.items():
        path = where.configs / f"{program}.json"
        path.write_bytes(msgspec.json.format(msgspec.json.encode(config)))
        written[program] = path
    return written


def programs(config: RunConfig, resolved: Resolved, where: Paths) -> list[Program]:
    """The supervised processes of the run, in start order."""
    files = write_service_configs(resolved, where)

    def serve(kind: str, *args: str) -> list[str]:
        return serve_command(kind, *args, log_level=config.log_level)

    def about(kind: str, detail: str = "") -> str:
        return f"{SERVICE_KINDS[kind].description}{f' ({detail})' if detail else ''}"

    tools = [
        Program(
            name=f"tools-{i}",
            description=about("tools"),
            command=serve(
                "tools",
                "-c",
                str(files["tools"]),
                "--group",
                groups(config.name)["tools"],
                "--instance",
                f"{config.name}-tools-{i}",
                "--results-url",
                (where.run_dir / "tool-results").as_uri(),
            ),
        )  # fmt: skip
        for i in range(config.tools.replicas)
    ]
    rollout = [
        Program(
            name=f"rollout-{i}",
            description=about("rollout", config.rollout.engine),
            command=serve(
                "rollout",
                "-c",
                str(files[f"rollout-{i}"]),
                *_engine_options(config, where),
                *_mistakes(config),
            ),
            stop_wait_s=resolved.rollout[i].drain_timeout_s + STOP_MARGIN_S,
        )  # fmt: skip
        for i in range(config.rollout.replicas)
    ]
    trainer = [
        Program(
            name="trainer",
            description=about("trainer"),
            command=_trainer_command(config, files["trainer"]),
            stop_wait_s=600.0,
            start_s=5.0,
        )  # fmt: skip
    ][: 1 if config.trainer.processes else 0]
    feeder = [
        Program(
            name="feeder",
            description=about("feeder"),
            command=serve("feeder", "-c", str(files["feeder"])),
        )  # fmt: skip
    ][: 1 if config.feeder.enabled else 0]
    evaluators = [
        Program(
            name=f"evaluator-{i}",
            description=about("evaluator", f"{_eval_engine(config)}, pinned versions"),
            command=serve(
                "evaluator",
                "-c",
                str(files["evaluator"]),
                "--instance",
                f"{config.name}-evaluator-{i}",
                *_engine_options(config, where, where.world_dir, _eval_engine(config)),
            ),
            stop_wait_s=resolved.evaluator.drain_timeout_s + STOP_MARGIN_S,
        )  # fmt: skip
        for i in range(config.eval.replicas)
    ]
    processor = [
        Program(
            name="eval-processor",
            description=about("eval-processor"),
            command=serve(
                "eval-processor",
                "-c",
                str(files["eval-processor"]),
                "--log-level",
                config.log_level,
            ),
        )  # fmt: skip
    ][: 1 if config.eval.replicas else 0]
    synth = [
        Program(
            name=f"synth-{i}",
            description=about("synth"),
            command=serve("synth", "-c", str(files["synth-processor"]), "--instance", str(i)),
        )  # fmt: skip
        for i in range(config.synth.replicas)
    ]
    metrics = [
        Program(
            name="metrics",
            description=about("metrics"),
            command=serve(
                "metrics", "--run", config.name, "--logdir", str(where.run_dir / "tensorboard")
            ),
        )  # fmt: skip
    ][: 1 if config.metrics.enabled else 0]
    return [*tools, *trainer, *rollout, *evaluators, *processor, *synth, *metrics, *feeder]


def _eval_engine(config: RunConfig) -> str:
    return config.eval.engine or config.rollout.engine


def _engine_options(
    config: RunConfig, where: Paths, qa: Path | None = None, engine: str = ""
) -> list[str]:
    """The engine options of a producer (`engine`, default the rollout engine); an expert knows
    the answers of `qa` (default: the questions it is fed)."""
    engine = engine or config.rollout.engine
    options = ["--engine", engine, "--model", str(where.model_dir)]
    if engine == "expert":
        options += ["--qa", str(qa or where.qa)]
    return options


def _mistakes(config: RunConfig) -> list[str]:
    """An expert producer's share of wrong answers (an expert evaluator makes none)."""
    if config.rollout.engine != "expert":
        return []
    return ["--mistake-rate", str(config.rollout.mistake_rate)]


def _trainer_command(config: RunConfig, file: Path) -> list[str]:
    if config.trainer.processes <= 1:
        return serve_command("trainer", "-c", str(file), log_level=config.log_level)
    # DeepSpeed's launcher starts one process per rank and sets RANK, WORLD_SIZE, MASTER_*.
    launcher = [sys.executable, "-m", "deepspeed.launcher.runner"]
    return [
        *launcher, "--num_gpus", str(config.trainer.processes), "--no_local_rank",
        "--master_port", str(config.trainer.master_port), "--module", CLI_MODULE,
        "--log-level", config.log_level, *SERVICE_KINDS["trainer"].command, "-c", str(file),
    ]  # fmt: skip


# The order `stream down` stops services in: nothing new is requested, producers drain their
# groups, the trainer finishes its step, then the tools nobody calls any more.
STOP_ORDER = (
    "feeder", "rollout-", "evaluator-", "trainer", "eval-processor", "synth-", "metrics",
    "tools-",
)  # fmt: skip


def stop_stages(names: list[str]) -> list[list[str]]:
    """`names` grouped by `STOP_ORDER` (unknown names last)."""
    stages = [[n for n in names if n.startswith(prefix)] for prefix in STOP_ORDER]
    rest = [n for n in names if not any(n.startswith(p) for p in STOP_ORDER)]
    return [stage for stage in [*stages, rest] if stage]
