"""Every service stops on SIGTERM, whatever it is doing: real `asearcher ... serve` processes.

A supervisor (`stream down`, supervisord, Kubernetes) stops services with SIGTERM at any moment:
while they load, before the group assigned them partitions, while they wait for work. Each must
exit by itself, promptly and with status 0.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from asearcher.streams.cluster.admin import skip_backlog
from asearcher.streams.wire.events import ServiceStatus
from asearcher.streams.wire.topics import TOOL_CALLS
from tests.conftest import DISTRIBUTED_VARIABLES
from tests.support.qa import write_qa
from tests.support.rollout import events_of
from tests.support.runs import ASEARCHER
from tests.support.trainer import tiny_model_dir

STOP_BOUND_S = 30.0
# Set by a torch process world in this interpreter; a child must set up its own.


class Service:
    """One `asearcher` command in its own process, its output in a file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        own = {k: v for k, v in env.items() if k not in DISTRIBUTED_VARIABLES}
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [ASEARCHER, "--log-level", "DEBUG", *args], env={**own, "COLUMNS": "250"},
                stdout=out, stderr=subprocess.STDOUT, cwd="/",
            )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            assert self.process.poll() is None, f"exited early:\n{self.output()}"
            assert time.monotonic() < deadline, (
                f"no {text!r} after {timeout:.0f}s:\n{self.output()}"
            )
            time.sleep(0.05)

    def stop(self) -> float:
        """SIGTERM it; assert it exits with 0 within the bound; return how long it took."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"still running {STOP_BOUND_S:.0f}s after SIGTERM:\n"
                                 f"{self.output()[-3000:]}") from None  # fmt: skip
        assert code == 0, f"exit status {code} after SIGTERM:\n{self.output()[-3000:]}"
        return time.monotonic() - started

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def start(worker_env: dict[str, str], tmp_path: Path):
    """Start `asearcher ARGS...` against the session broker; every process is killed after."""
    started: list[Service] = []
    env = {**worker_env, "ASEARCHER_HOME": str(tmp_path / "home")}

    def run(*args: str) -> Service:
        service = Service(list(args), env, tmp_path / f"service-{len(started)}.log")
        started.append(service)
        return service

    yield run
    for service in started:
        service.kill()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny policy, next to the synthetic world it was made from (world/qa_train.jsonl)."""
    return tiny_model_dir(tmp_path_factory.mktemp("signals-model"))


def wait_for_heartbeat(settings, codec, topic: str, service: Service, states: set[str]) -> None:
    """Until the service reported one of `states` on its private status topic."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert service.process.poll() is None, f"exited early:\n{service.output()}"
        beats = [e for e in events_of(settings, codec, topic) if isinstance(e, ServiceStatus)]
        if any(beat.state in states for beat in beats):
            return
        time.sleep(0.5)
    raise AssertionError(f"no heartbeat in {states}:\n{service.output()}")


# -- tool worker ---------------------------------------------------------------------------------


def tool_worker(start, settings, tmp_path: Path) -> Service:
    # A fresh group that starts after the calls other tests left, so it surely waits for work.
    group = f"signals-{uuid.uuid4().hex[:8]}"
    skip_backlog(settings, group, TOOL_CALLS)
    config = tmp_path / "tools.toml"
    config.write_text('search = "tests.workers.slow_search:SlowSearch"\nreader = "http"\n')
    results = (tmp_path / "results").as_uri()
    return start("tools", "serve", "-c", str(config), "--group", group, "--results-url", results)


@pytest.mark.slow
def test_tool_worker_sigterm_while_waiting_for_calls_exits_0(start, settings, tmp_path) -> None:
    worker = tool_worker(start, settings, tmp_path)
    worker.wait_for("assigned")
    worker.stop()
    assert "answered 0 calls" in worker.output()


@pytest.mark.slow
def test_tool_worker_sigterm_right_after_start_before_assignment_exits_0(
    start, settings, tmp_path
) -> None:
    worker = tool_worker(start, settings, tmp_path)
    worker.wait_for("tool worker in group")
    worker.stop()
    assert "answered 0 calls" in worker.output()


@pytest.mark.slow
def test_tool_worker_sigterm_while_starting_exits_0(start, settings, tmp_path) -> None:
    worker = tool_worker(start, settings, tmp_path)
    worker.wait_for("starting: SIGTERM")
    worker.stop()


# -- trainer -------------------------------------------------------------------------------------


def trainer(start, make_topic, model_dir: Path, tmp_path: Path) -> tuple[Service, str]:
    status = make_topic(like="service.status")
    config = tmp_path / "trainer.toml"
    config.write_text(
        f'group_id = "signals-{uuid.uuid4().hex[:6]}"\ninstance = "{uuid.uuid4().hex}"\n'
        "status_every_s = 0.5\n[batching]\ngroups_per_batch = 2\n[topics]\n"
        f'trajectories = "{make_topic(like="trajectories", partitions=2)}"\n'
        f'weights = "{make_topic(like="weights")}"\n'
        f'metrics = "{make_topic(like="trainer.metrics")}"\nstatus = "{status}"\n'
    )
    store = (tmp_path / "weights").as_uri()
    args = ["train", "serve", "-c", str(config), "--model", str(model_dir), "--store", store]
    return start(*args), status


@pytest.mark.slow
def test_trainer_sigterm_while_waiting_for_trajectories_exits_0(
    start, settings, codec, make_topic, model_dir, tmp_path
) -> None:
    service, status = trainer(start, make_topic, model_dir, tmp_path)
    wait_for_heartbeat(settings, codec, status, service, {"running", "waiting"})
    service.stop()
    assert "trained 0 steps" in service.output()


@pytest.mark.slow
def test_trainer_sigterm_right_after_start_before_assignment_exits_0(
    start, make_topic, model_dir, tmp_path
) -> None:
    service, _ = trainer(start, make_topic, model_dir, tmp_path)
    service.wait_for("trainer at v0")
    service.stop()
    assert "trained 0 steps" in service.output()


@pytest.mark.slow
def test_trainer_sigterm_while_loading_the_model_exits_0(
    start, make_topic, model_dir, tmp_path
) -> None:
    service, _ = trainer(start, make_topic, model_dir, tmp_path)
    service.wait_for("starting: SIGTERM")
    service.stop()
    assert "trained 0 steps" in service.output()


# -- rollout producer and feeder -----------------------------------------------------------------


@pytest.mark.slow
def test_rollout_producer_sigterm_while_waiting_for_requests_exits_0(
    start, settings, codec, make_topic, model_dir, tmp_path
) -> None:
    status = make_topic(like="service.status")
    topics = {
        "requests": "rollout.requests", "steps": "rollout.steps", "tool_calls": "tool.calls",
        "tool_results": "tool.results", "trajectories": "trajectories", "weights": "weights",
        "metrics": "trainer.metrics",
    }  # fmt: skip
    private = "".join(f'{key} = "{make_topic(like=like)}"\n' for key, like in topics.items())
    config = tmp_path / "rollout.toml"
    config.write_text(f'status_every_s = 0.5\n[topics]\n{private}status = "{status}"\n')
    qa = model_dir.parent / "world" / "qa_train.jsonl"  # the expert knows these answers
    service = start(
        "rollout", "serve", "-c", str(config), "--engine", "expert", "--qa", str(qa),
        "--model", str(model_dir), "--group", f"signals-{uuid.uuid4().hex[:6]}",
    )  # fmt: skip
    wait_for_heartbeat(settings, codec, status, service, {"running", "waiting"})
    service.stop()
    assert "finished:" in service.output()


@pytest.mark.slow
def test_feeder_sigterm_while_waiting_for_groups_to_finish_exits_0(
    start, settings, codec, make_topic, tmp_path
) -> None:
    status = make_topic(like="service.status")
    topics = {"requests": "rollout.requests", "trajectories": "trajectories",
              "dead_letters": "dead.letters", "progress": "feeder.progress"}  # fmt: skip
    private = "".join(f'{key} = "{make_topic(like=like)}"\n' for key, like in topics.items())
    name = uuid.uuid4().hex[:8]
    config = tmp_path / "feeder.toml"
    config.write_text(
        f'qa = "{write_qa(tmp_path / "qa.jsonl", 4)}"\nrun = "run-{name}"\n'
        f'instance = "signals-{name}"\noutstanding = 2\nstatus_every_s = 0.5\n'
        f'[topics]\n{private}status = "{status}"\n'
    )
    service = start("feed", "serve", "-c", str(config))
    wait_for_heartbeat(settings, codec, status, service, {"waiting"})
    service.stop()
    assert "feeder stopped" in service.output()


# -- synthesis processor -------------------------------------------------------------------------


@pytest.mark.slow
def test_synthesis_processor_sigterm_while_waiting_for_seeds_exits_0(
    start, make_topic, tmp_path
) -> None:
    job = f"signals-{uuid.uuid4().hex[:6]}"
    config = tmp_path / "synth.toml"
    config.write_text(
        f'app_id = "asearcher-synth-{job}"\njob = "{job}"\ninstance = "0"\n'
        f'world_entities = 60\nrequests_topic = "{make_topic(like="synth.requests")}"\n'
    )
    service = start("synth", "process", "-c", str(config))
    service.wait_for("from offset")  # its partitions are assigned: it waits for seeds
    service.stop()
    assert "synthesized 0 seed(s)" in service.output()
