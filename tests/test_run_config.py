"""The run config: what `resolve` derives per service, what it refuses, what `programs` runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from asearcher.cli.run.config import (
    STOP_MARGIN_S,
    RunConfig,
    load_run_config,
    paths,
    programs,
    resolve,
    stop_stages,
)
from asearcher.consumers.evaluation.eval_processor import EvalProcessorConfig
from asearcher.consumers.tools.toolbox import load_tool_config
from asearcher.producers.rollout.feeder import load_feeder_config
from asearcher.producers.rollout.service import load_rollout_config
from asearcher.producers.rollout.staleness import StalenessConfig, StalenessGate
from asearcher.producers.synthesis.processor import SynthProcessorConfig
from asearcher.streams.service.config_file import load_config
from asearcher.streams.service.supervisor import Program
from asearcher.trainer.runtime.config import load_trainer_config
from tests.conftest import readme_toml


def _load(tmp_path: Path, text: str) -> RunConfig:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return load_run_config(path)


def _sized(replicas: int, groups_per_batch: int, group_size: int, eta: int) -> str:
    return (
        f"[rollout]\nreplicas = {replicas}\n"
        f"[trainer.config.batching]\ngroups_per_batch = {groups_per_batch}\neta = {eta}\n"
        f"[feeder.config]\ngroup_size = {group_size}\n"
    )


def _config_file(program: Program) -> Path:
    """The `-c` file a program's command passes to its service."""
    return Path(program.command[program.command.index("-c") + 1])


def _by_name(listed: list[Program]) -> dict[str, Program]:
    return {program.name: program for program in listed}


@pytest.mark.parametrize(
    ("replicas", "groups_per_batch", "group_size", "eta", "shares"),
    [(3, 5, 4, 2, [2, 2, 1]), (1, 8, 4, 4, [8]), (2, 4, 4, 0, [2, 2]), (4, 6, 2, 1, [2, 2, 1, 1])],
)
def test_resolve_staleness_follows_trainer_batch_and_replicas(
    tmp_path: Path, replicas: int, groups_per_batch: int, group_size: int, eta: int,
    shares: list[int],
) -> None:  # fmt: skip
    config = _load(tmp_path, _sized(replicas, groups_per_batch, group_size, eta))
    resolved = resolve(config, paths(config, tmp_path))
    assert len(resolved.rollout) == replicas
    expected = [
        StalenessConfig(
            eta=eta, batch_groups=groups_per_batch, producers=replicas, producer_index=index,
        )
        for index in range(replicas)
    ]  # fmt: skip
    assert [rollout.staleness for rollout in resolved.rollout] == expected
    assert resolved.trainer.batching.eta == eta
    assert [config.share for config in expected] == shares


def test_resolve_more_producers_than_groups_per_batch_is_refused(tmp_path: Path) -> None:
    config = _load(tmp_path, _sized(3, 2, 4, 1))
    with pytest.raises(ValueError, match="a producer would get no share"):
        resolve(config, paths(config, tmp_path))


def test_resolve_zero_rollout_replicas_gives_no_rollout_configs(tmp_path: Path) -> None:
    config = _load(tmp_path, "[rollout]\nreplicas = 0\n")
    resolved = resolve(config, paths(config, tmp_path))
    assert resolved.rollout == []


def _steps_before_stall(shares: list[StalenessConfig], steps: int) -> int:
    """Trainer steps the producers' gates allow when every delivered group is trained."""
    gates = [StalenessGate(staleness, base_version=0) for staleness in shares]
    batch = shares[0].batch_groups
    delivered = version = 0
    while version < steps:
        for gate in gates:
            while gate.admits(version):
                gate.record_start()
                delivered += 1
        if delivered - version * batch < batch:
            return version
        version += 1
    return version


@pytest.mark.parametrize(("replicas", "eta"), [(3, 2), (4, 0), (5, 1)])
def test_resolve_shares_of_all_producers_keep_the_trainer_fed(
    tmp_path: Path, replicas: int, eta: int
) -> None:
    config = _load(tmp_path, _sized(replicas, groups_per_batch=5, group_size=4, eta=eta))
    resolved = resolve(config, paths(config, tmp_path))
    shares = [rollout.staleness for rollout in resolved.rollout]
    assert sum(s.share for s in shares) == shares[0].batch_groups
    assert _steps_before_stall(shares, steps=100) == 100


def test_resolve_names_instances_groups_and_paths_after_the_run(tmp_path: Path) -> None:
    config = _load(tmp_path, 'name = "exp1"\n[rollout]\nreplicas = 2\n')
    where = paths(config, tmp_path)
    resolved = resolve(config, where)
    assert [r.instance for r in resolved.rollout] == ["exp1-rollout-0", "exp1-rollout-1"]
    assert {r.model for r in resolved.rollout} == {"exp1"}
    assert {r.group_id for r in resolved.rollout} == {"asearcher-exp1-rollout"}
    trainer = resolved.trainer
    assert (trainer.model, trainer.instance) == ("exp1", "exp1-trainer")
    assert trainer.group_id == "asearcher-exp1-trainer"
    assert trainer.store == where.store and trainer.model_dir == str(where.model_dir)
    feeder = resolved.feeder
    assert (feeder.run, feeder.instance, feeder.qa) == ("exp1", "exp1-feeder", str(where.qa))
    assert resolved.tools.index_dir == str(where.index_dir)


def test_paths_defaults_live_under_home_and_the_world_of_the_data_section(tmp_path: Path) -> None:
    config = _load(tmp_path, 'name = "exp1"\n[data]\nworld_seed = 7\nworld_entities = 50\n')
    where = paths(config, tmp_path)
    world = tmp_path / "build" / "world-7-50"
    assert where.run_dir == tmp_path / "runs" / "exp1"
    assert where.store == (tmp_path / "runs" / "exp1" / "weights").as_uri()
    assert where.store.startswith("file:///")
    assert where.model_dir == tmp_path / "model"
    assert where.world_dir == world
    assert where.qa == world / "qa_train.jsonl"
    assert where.index_dir == world / "index"
    assert where.configs == where.run_dir / "config"


def test_paths_given_in_the_file_replace_the_defaults(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    config = _load(
        tmp_path,
        'model_dir = "~/m"\nstore = "s3://bucket/w"\n'
        '[data]\nqa = "/data/qa.jsonl"\nindex_dir = "/data/index"\n',
    )
    where = paths(config, tmp_path)
    assert where.model_dir == tmp_path / "user" / "m"
    assert where.store == "s3://bucket/w"
    assert (where.qa, where.index_dir) == (Path("/data/qa.jsonl"), Path("/data/index"))
    assert resolve(config, where).trainer.store == "s3://bucket/w"


@pytest.mark.parametrize(
    ("text", "field", "source"),
    [
        ("[rollout.config.staleness]\neta = 2\n", "rollout.config.staleness", "trainer.config"),
        ('[rollout.config]\nmodel = "x"\n', "rollout.config.model", "name"),
        ('[rollout.config]\ninstance = "x"\n', "rollout.config.instance", "name"),
        ('[rollout.config]\ngroup_id = "x"\n', "rollout.config.group_id", "name"),
        ('[trainer.config]\nmodel = "x"\n', "trainer.config.model", "name"),
        ('[trainer.config]\nstore = "file:///x"\n', "trainer.config.store", "store"),
        ('[trainer.config]\nmodel_dir = "/x"\n', "trainer.config.model_dir", "model_dir"),
        ('[tools.config]\nindex_dir = "/x"\n', "tools.config.index_dir", "data.index_dir"),
        ('[feeder.config]\nrun = "x"\n', "feeder.config.run", "name"),
        ('[feeder.config]\nqa = "q.jsonl"\n', "feeder.config.qa", "data.qa"),
        ('[feeder.config]\ninstance = "x"\n', "feeder.config.instance", "name"),
    ],
)
def test_resolve_derived_setting_in_the_file_is_refused_naming_its_source(
    tmp_path: Path, text: str, field: str, source: str
) -> None:
    with pytest.raises(ValueError) as raised:
        config = _load(tmp_path, text)
        resolve(config, paths(config, tmp_path))
    message = str(raised.value)
    assert f"{field} is derived from {source}" in message
    assert "\n" not in message


def test_resolve_min_group_size_above_group_size_is_refused(tmp_path: Path) -> None:
    config = _load(
        tmp_path, "[trainer.config.batching]\nmin_group_size = 5\n[feeder.config]\ngroup_size = 4\n"
    )
    with pytest.raises(ValueError, match=r"min_group_size \(5\) exceeds .*group_size \(4\)"):
        resolve(config, paths(config, tmp_path))


def test_resolve_min_group_size_equal_to_group_size_is_accepted(tmp_path: Path) -> None:
    config = _load(
        tmp_path, "[trainer.config.batching]\nmin_group_size = 4\n[feeder.config]\ngroup_size = 4\n"
    )
    assert resolve(config, paths(config, tmp_path)).trainer.batching.min_group_size == 4


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('name = "a b"\n', "name 'a b'"),
        ("[rollout]\nreplicas = -1\n", "rollout.replicas"),
        ("[tools]\nreplicas = 300\n", "tools.replicas"),
        ("[trainer]\nprocesses = -2\n", "trainer.processes"),
        ('[rollout]\nengine = "sglang"\n', "rollout.engine"),
        ("colour = 1\n", "unknown field `colour`"),
        ("[rollout.config]\ncolour = 1\n", "`colour` - at `$.rollout.config`"),
        ('[trainer.config.batching]\neta = "two"\n', "$.trainer.config.batching.eta"),
    ],
)
def test_load_run_config_bad_setting_is_one_line_naming_it(
    tmp_path: Path, text: str, named: str
) -> None:
    with pytest.raises(ValueError) as raised:
        _load(tmp_path, text)
    message = str(raised.value)
    assert named in message and "run.toml" in message
    assert "\n" not in message


def test_load_run_config_without_a_file_is_the_embedded_default() -> None:
    config = load_run_config(None)
    assert config == RunConfig()
    assert (config.name, config.rollout.replicas, config.trainer.processes) == ("default", 1, 1)


def test_programs_are_named_and_ordered_tools_trainer_rollout_eval_feeder(tmp_path: Path) -> None:
    config = _load(tmp_path, "[tools]\nreplicas = 2\n[rollout]\nreplicas = 3\n")
    where = paths(config, tmp_path)
    listed = programs(config, resolve(config, where), where)
    assert [p.name for p in listed] == [
        "tools-0", "tools-1", "trainer", "rollout-0", "rollout-1", "rollout-2", "evaluator-0",
        "eval-processor", "metrics", "feeder",
    ]  # fmt: skip
    app = [sys.executable, "-m", "asearcher.cli.app", "--log-level", "INFO"]
    assert all(p.command[:5] == app for p in listed)
    tools = _by_name(listed)["tools-1"].command
    assert tools[5:7] == ["tools", "serve"]
    assert tools[tools.index("--group") + 1] == "asearcher-default-tools"
    assert tools[tools.index("--instance") + 1] == "default-tools-1"
    assert tools[tools.index("--results-url") + 1] == (where.run_dir / "tool-results").as_uri()


def test_programs_config_files_load_back_as_the_resolved_configs(tmp_path: Path) -> None:
    config = _load(tmp_path, 'name = "rt"\n[tools]\nreplicas = 2\n[rollout]\nreplicas = 3\n')
    where = paths(config, tmp_path)
    resolved = resolve(config, where)
    listed = _by_name(programs(config, resolved, where))
    files = {name: _config_file(program) for name, program in listed.items() if name != "metrics"}
    assert all(path.parent == where.configs for path in files.values())
    for index, expected in enumerate(resolved.rollout):
        assert load_rollout_config(files[f"rollout-{index}"]) == expected
    assert load_trainer_config(files["trainer"]) == resolved.trainer
    assert load_feeder_config(files["feeder"]) == resolved.feeder
    assert load_rollout_config(files["evaluator-0"]) == resolved.evaluator
    assert load_config(EvalProcessorConfig, "x", files["eval-processor"]) == (
        resolved.eval_processor
    )
    assert load_tool_config(files["tools-0"]) == resolved.tools
    assert files["tools-0"] == files["tools-1"]
    # The files hold the derived settings, not the defaults they replace.
    assert load_rollout_config(files["rollout-2"]).instance == "rt-rollout-2"


def test_programs_expert_engine_gets_the_qa_file_and_mistake_rate(tmp_path: Path) -> None:
    config = _load(tmp_path, '[rollout]\nengine = "expert"\nmistake_rate = 0.25\n')
    where = paths(config, tmp_path)
    command = _by_name(programs(config, resolve(config, where), where))["rollout-0"].command
    assert command[command.index("--engine") + 1] == "expert"
    assert command[command.index("--model") + 1] == str(where.model_dir)
    assert command[command.index("--qa") + 1] == str(where.qa)
    assert command[command.index("--mistake-rate") + 1] == "0.25"


def test_programs_transformers_engine_gets_no_expert_options(tmp_path: Path) -> None:
    config = _load(tmp_path, "")
    where = paths(config, tmp_path)
    command = _by_name(programs(config, resolve(config, where), where))["rollout-0"].command
    assert command[command.index("--engine") + 1] == "transformers"
    assert "--qa" not in command and "--mistake-rate" not in command


def test_programs_one_trainer_process_runs_the_app_directly(tmp_path: Path) -> None:
    config = _load(tmp_path, 'log_level = "DEBUG"\n')
    where = paths(config, tmp_path)
    command = _by_name(programs(config, resolve(config, where), where))["trainer"].command
    assert command == [
        sys.executable, "-m", "asearcher.cli.app", "--log-level", "DEBUG",
        "train", "serve", "-c", str(where.configs / "trainer.json"),
    ]  # fmt: skip


def test_programs_two_trainer_processes_use_the_deepspeed_launcher(tmp_path: Path) -> None:
    config = _load(tmp_path, "[trainer]\nprocesses = 2\n")
    where = paths(config, tmp_path)
    command = _by_name(programs(config, resolve(config, where), where))["trainer"].command
    assert command[:3] == [sys.executable, "-m", "deepspeed.launcher.runner"]
    assert command[command.index("--num_gpus") + 1] == "2"
    assert command[command.index("--module") + 1] == "asearcher.cli.app"
    assert command[-4:] == ["train", "serve", "-c", str(where.configs / "trainer.json")]


def test_programs_without_trainer_processes_feeder_or_eval_leave_them_out(tmp_path: Path) -> None:
    config = _load(
        tmp_path,
        "[tools]\nreplicas = 0\n[trainer]\nprocesses = 0\n[feeder]\nenabled = false\n"
        "[eval]\nreplicas = 0\n[metrics]\nenabled = false\n",
    )
    where = paths(config, tmp_path)
    assert [p.name for p in programs(config, resolve(config, where), where)] == ["rollout-0"]


def test_programs_rollout_stop_wait_exceeds_its_drain_timeout(tmp_path: Path) -> None:
    config = _load(tmp_path, "[rollout]\nreplicas = 2\n[rollout.config]\ndrain_timeout_s = 90\n")
    where = paths(config, tmp_path)
    resolved = resolve(config, where)
    listed = _by_name(programs(config, resolved, where))
    for index in range(2):
        stop_wait = listed[f"rollout-{index}"].stop_wait_s
        assert stop_wait > resolved.rollout[index].drain_timeout_s == 90
        assert stop_wait == 90 + STOP_MARGIN_S


def test_synthesis_processors_are_services_of_the_run_with_derived_settings(
    tmp_path: Path,
) -> None:
    config = _load(tmp_path, 'name = "sy"\n[data]\nworld_entities = 80\n[synth]\nreplicas = 2\n'
                   "[synth.config.synthesis]\nmax_edits = 3\n")  # fmt: skip
    where = paths(config, tmp_path)
    resolved = resolve(config, where)
    listed = _by_name(programs(config, resolved, where))
    assert {"synth-0", "synth-1"} <= set(listed)
    assert listed["synth-1"].command[5:7] == ["synth", "process"]
    loaded = load_config(SynthProcessorConfig, "x", _config_file(listed["synth-0"]))
    assert loaded == resolved.synth_processor
    assert (loaded.app_id, loaded.job, loaded.world_entities) == ("asearcher-sy-synth", "sy", 80)
    assert loaded.synthesis.max_edits == 3
    with pytest.raises(ValueError, match="synth.config.job is derived from name"):
        _load(tmp_path, '[synth.config]\njob = "mine"\n')
    assert stop_stages(["tools-0", "synth-0", "trainer"]) == [["trainer"], ["synth-0"],
                                                              ["tools-0"]]  # fmt: skip


def test_stop_stages_order_feeder_rollout_trainer_tools_then_unknown() -> None:
    names = ["tools-0", "web", "trainer", "rollout-1", "feeder", "rollout-0", "tools-1",
             "eval-processor", "evaluator-0"]  # fmt: skip
    assert stop_stages(names) == [
        ["feeder"], ["rollout-1", "rollout-0"], ["evaluator-0"], ["trainer"], ["eval-processor"],
        ["tools-0", "tools-1"], ["web"],
    ]  # fmt: skip


def test_stop_stages_absent_kinds_leave_no_empty_stage() -> None:
    assert stop_stages(["tools-0", "trainer"]) == [["trainer"], ["tools-0"]]
    assert stop_stages([]) == []


def test_readme_run_config_example_loads_and_resolves(tmp_path: Path) -> None:
    config = _load(tmp_path, readme_toml("each takes 1/replicas of the staleness budget"))
    resolved = resolve(config, paths(config, tmp_path))
    assert len(resolved.rollout) == config.rollout.replicas
    batching = config.trainer.config.batching
    for rollout in resolved.rollout:
        assert rollout.staleness.producers == config.rollout.replicas
        assert rollout.staleness.eta == batching.eta
        assert rollout.staleness.batch_groups == batching.groups_per_batch


def test_an_expert_evaluator_knows_every_question_of_the_world(tmp_path: Path) -> None:
    # The held-out ones that `learn` scores and the validation ones continuous evaluation may.
    config = _load(tmp_path, '[rollout]\nengine = "expert"\nmistake_rate = 0.3\n')
    where = paths(config, tmp_path)
    listed = _by_name(programs(config, resolve(config, where), where))
    evaluator, producer = listed["evaluator-0"].command, listed["rollout-0"].command
    assert evaluator[evaluator.index("--qa") + 1] == str(where.world_dir)
    assert producer[producer.index("--qa") + 1] == str(where.qa)
    assert "--mistake-rate" in producer and "--mistake-rate" not in evaluator


def test_the_evaluators_may_play_another_engine_than_the_producers(tmp_path: Path) -> None:
    config = _load(tmp_path, '[rollout]\nengine = "expert"\n[eval]\nengine = "transformers"\n')
    where = paths(config, tmp_path)
    listed = _by_name(programs(config, resolve(config, where), where))
    evaluator, producer = listed["evaluator-0"].command, listed["rollout-0"].command
    assert evaluator[evaluator.index("--engine") + 1] == "transformers" and "--qa" not in evaluator
    assert producer[producer.index("--engine") + 1] == "expert"
    assert listed["evaluator-0"].description == "evaluator (transformers, pinned versions)"
    with pytest.raises(ValueError, match="eval.engine must be empty or one of"):
        _load(tmp_path, '[eval]\nengine = "gpt"\n')


def test_a_validation_split_is_the_runs_alone_and_continuous_evaluation_may_choose_by_it(
    tmp_path: Path,
) -> None:
    from asearcher.cli.run.config import demonstration_data

    text = (
        "[data]\nworld_valid_share = 0.1\n[eval]\nkeep_best = true\n"
        '[eval.config]\nsplit = "valid"\n[warm_start]\nworlds = 1\nborrow_names = true\n'
    )
    config = _load(tmp_path, text)
    plain = _load(tmp_path, "[warm_start]\nworlds = 1\nborrow_names = true\n")
    assert config.data.world_key() == plain.data.world_key() + "-kindvalid10"
    # The demonstration worlds, the policy made from them and so the warm start stay the same.
    assert demonstration_data(config) == demonstration_data(plain)
    assert paths(config, tmp_path).model_dir == paths(plain, tmp_path).model_dir
    where = paths(config, tmp_path)
    assert resolve(config, where).eval_processor.split == "valid"


def test_a_larger_held_out_split_is_the_runs_alone(tmp_path: Path) -> None:
    from asearcher.cli.run.config import demonstration_data

    warm = "[warm_start]\nworlds = 1\nborrow_names = true\n"
    config = _load(tmp_path, "[data]\nworld_test_share = 0.35\n" + warm)
    plain = _load(tmp_path, warm)
    assert config.data.world_key() == plain.data.world_key() + "-test35"
    # The demonstration worlds keep the default fifth: the same demonstrations and policy.
    assert demonstration_data(config) == demonstration_data(plain)
    assert paths(config, tmp_path).model_dir == paths(plain, tmp_path).model_dir


@pytest.mark.parametrize(
    ("text", "named"),
    [("[data]\nworld_valid_share = 0.6\n", "data.world_valid_share must be within"),
     ('[eval.config]\nsplit = "valid"\n', "data.world_valid_share is 0"),
     ("[data]\nworld_test_share = 0.6\n", "data.world_test_share must be within"),
     ("[data]\nworld_test_share = 0.5\nworld_valid_share = 0.4\n", "leave a fifth"),
     ("[eval]\nkeep_best = true\n", 'it must be "valid", or the held-out questions')],
)  # fmt: skip
def test_a_choice_by_held_out_questions_or_an_empty_validation_split_is_refused(
    tmp_path: Path, text: str, named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        _load(tmp_path, text)


def test_demonstration_worlds_are_seeded_apart_and_the_policy_is_made_from_them(
    tmp_path: Path,
) -> None:
    from asearcher.cli.run.config import DEMONSTRATION_SEED, demonstration_data

    config = load_config(RunConfig, "run config", None, warm_start={
        "enabled": True, "worlds": 2, "world_entities": 500, "shortcut_rate": 0.25,
    })  # fmt: skip
    worlds = demonstration_data(config)
    assert [w.world_seed for w in worlds] == [DEMONSTRATION_SEED, DEMONSTRATION_SEED + 1]
    assert all(w.world_entities == 500 and w.qa is None for w in worlds)
    # The rest of their shape is the run's: same questions, hops and page style.
    assert {(w.world_questions, w.world_max_hops, w.world_filler) for w in worlds} == {
        (config.data.world_questions, config.data.world_max_hops, config.data.world_filler)
    }
    where = paths(config, tmp_path)
    assert where.demonstration_worlds == tuple(tmp_path / "build" / w.world_key() for w in worlds)
    # The policy (tokenizer and pretraining) lives with the worlds it read, not the run's.
    assert where.world_dir not in where.model_dir.parents
    assert where.model_dir.name.startswith(f"{where.demonstration_worlds[0].name}-x2-policy-")
    # Shortcuts are what the clone must inherit: every demonstration is cloned then.
    assert config.warm_start.min_reward == 0.0
    # Without demonstration worlds (or without a warm start) nothing changes.
    plain = load_config(RunConfig, "run config", None, warm_start={"enabled": True})
    assert demonstration_data(plain) == [] and paths(plain, tmp_path).demonstration_worlds == ()
    assert plain.warm_start.min_reward == 1.0
    off = load_config(RunConfig, "run config", None, warm_start={"worlds": 3})
    assert demonstration_data(off) == []


def test_the_warm_start_clones_with_its_own_epochs_batch_rate_and_schedule() -> None:
    from asearcher.cli.run.warm_start import cloning_config

    config = load_config(RunConfig, "run config", None, warm_start={
        "enabled": True, "worlds": 2, "epochs": 5, "batch": 6, "lr": 2e-4, "lr_decay": True,
    })  # fmt: skip
    sft = cloning_config(config, model="m", seed=9)
    got = (sft.epochs, sft.trajectories_per_step, sft.lr, sft.lr_decay, sft.seed)
    assert got == (5, 6, 2e-4, True, 9)
    assert sft.run == config.name and sft.model == "m"
    plain = load_config(RunConfig, "run config", None, warm_start={"enabled": True})
    assert cloning_config(plain, model="m", seed=0).lr_decay is False


@pytest.mark.parametrize(
    ("setting", "named"),
    [({"worlds": -1}, "warm_start.worlds"), ({"worlds": 51}, "warm_start.worlds"),
     ({"shortcut_rate": 1.0}, "warm_start.shortcut_rate"),
     ({"world_entities": 0}, "warm_start.world_entities"),
     ({"borrow_names": True}, "warm_start.borrow_names needs demonstration worlds"),
     ({"orders": 0}, "warm_start.orders must be at least 1"),
     ({"orders": 3}, "warm_start.orders > 1 needs demonstration worlds"),
     ({"snapshots": 0}, "warm_start.snapshots must be at least 1"),
     ({"snapshots": 2}, "warm_start.snapshots > 1 needs demonstration worlds"),
     ({"orders": 3, "worlds": 1, "selection_questions": 0}, "warm_start.selection_questions"),
     ({"borrow_names": True, "worlds": 1, "world_entities": 90},
      "warm_start.world_entities 90 is not data.world_entities 300")],
)  # fmt: skip
def test_a_bad_warm_start_setting_is_refused_by_name(setting: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        load_config(RunConfig, "run config", None, warm_start=setting)


def test_clones_are_chosen_on_the_demonstration_worlds_held_out_questions_only(
    tmp_path: Path,
) -> None:
    from asearcher.cli.run.clone_selection import selection_sets

    warm = {"enabled": True, "worlds": 2, "orders": 3, "selection_questions": 2}
    config = load_config(RunConfig, "run config", None, warm_start=warm)
    where = paths(config, tmp_path)
    for world in (where.world_dir, *where.demonstration_worlds):
        world.mkdir(parents=True)
        for split in ("train", "test"):
            lines = [json.dumps({"id": f"{world.name}-{split}-{i}", "question": "q?",
                                 "answers": ["a"], "hops": 1, "supporting_urls": [],
                                 "split": split}) for i in range(3)]  # fmt: skip
            (world / f"qa_{split}.jsonl").write_text("\n".join(lines) + "\n")
    sets = selection_sets(where, config)
    assert [s.index_dir for s in sets] == [w / "index" for w in where.demonstration_worlds]
    assert [[q.id for q in s.questions] for s in sets] == [
        [f"{w.name}-test-0", f"{w.name}-test-1"] for w in where.demonstration_worlds
    ]


def test_demonstration_worlds_that_borrow_names_take_the_runs_and_live_apart(
    tmp_path: Path,
) -> None:
    from asearcher.cli.run.config import demonstration_data

    warm = {"enabled": True, "worlds": 2, "borrow_names": True}
    config = load_config(RunConfig, "run config", None, warm_start=warm, data={"world_seed": 5})
    worlds = demonstration_data(config)
    assert [w.world_names_from for w in worlds] == [5, 5]
    assert all(w.world_seed != 5 and w.world_entities == 300 for w in worlds)
    # A borrowing world is another world than the one of its seed with names of its own.
    unborrowed = {**warm, "borrow_names": False}
    plain = load_config(
        RunConfig, "run config", None, warm_start=unborrowed, data={"world_seed": 5}
    )
    own = demonstration_data(plain)
    assert {w.world_key() for w in worlds}.isdisjoint(w.world_key() for w in own)
    assert paths(config, tmp_path).model_dir != paths(plain, tmp_path).model_dir


def test_the_demonstration_corpus_holds_every_world_once_and_is_kept(tmp_path: Path) -> None:
    from asearcher.cli.run.prepare import demonstration_corpus

    worlds = []
    for number in range(2):
        corpus = tmp_path / f"w{number}.jsonl"
        corpus.write_bytes(f'{{"title": "T{number}", "contents": "c"}}\n'.encode())
        worlds.append(corpus)
    combined = demonstration_corpus(tmp_path / "policy-x", worlds)
    assert combined == tmp_path / "policy-x-corpus.jsonl"
    assert combined.read_text().splitlines() == [w.read_text().strip() for w in worlds]
    worlds[0].write_text("changed\n")  # built once: a second call keeps what the policy read
    assert demonstration_corpus(tmp_path / "policy-x", worlds).read_text().count("T0") == 1


# The example of docs/cluster.md: two producers, a learner host and an actors host.
SPREAD = readme_toml("[hosts.learner]")


def test_hosts_share_every_program_of_the_run_once_in_the_files_order(tmp_path: Path) -> None:
    from asearcher.cli.run.hosts import host_programs

    config = _load(tmp_path, SPREAD + "[hosts.more]\n")  # a host with nothing on it is allowed
    every = {
        p.name
        for p in programs(config, resolve(config, paths(config, tmp_path)), paths(config, tmp_path))
    }
    learner, actors = host_programs(config, "learner"), host_programs(config, "actors")
    assert learner == {"tools-0", "trainer", "feeder", "eval-processor", "metrics"}
    assert actors == {"rollout-0", "rollout-1", "evaluator-0"}
    assert learner | actors == every and not learner & actors
    assert host_programs(config, "more") == frozenset()
    with pytest.raises(ValueError, match="'elsewhere' is not in the run config's hosts"):
        host_programs(config, "elsewhere")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (("rollout = 2", "rollout = 1"), "hosts place 1 of rollout.replicas = 2"),
        (("tools = 1", "tools = 0"), "hosts place 0 of tools.replicas = 1"),
        (("eval = 1", "eval = 2"), "hosts place 2 of eval.replicas = 1"),
        (("trainer = true", "trainer = false"), "`trainer = true` must be on 1 host"),
        (("eval = 1", "eval = 1\nfeeder = true"), "`feeder = true` must be on 1 host"),
    ],
)
def test_hosts_that_do_not_add_up_to_the_run_are_refused_by_name(
    tmp_path: Path, change: tuple[str, str], named: str
) -> None:
    with pytest.raises(ValueError, match=named.replace(".", r"\.").replace("`", ".")):
        _load(tmp_path, SPREAD.replace(*change, 1))


def test_a_run_spread_over_hosts_is_started_only_with_a_host_named(tmp_path: Path) -> None:
    from asearcher.cli.run import topology
    from asearcher.streams.cluster.settings import KafkaSettings

    config = _load(tmp_path, SPREAD)
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:1", external=True)
    with pytest.raises(ValueError, match="name this machine's with --host"):
        topology.up(config, settings, tmp_path / "home")
    with pytest.raises(ValueError, match="--host 'nowhere'"):
        topology.up(config, settings, tmp_path / "home", host="nowhere")
