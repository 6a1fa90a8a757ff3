"""Settings resolution, and the package as `pip install .` lays it out."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from asearcher.streams.cluster.settings import (
    SettingsError,
    claim_store,
    client_options_from_env,
    kafka_settings,
)

ROOT = Path(__file__).resolve().parents[1]


def test_security_settings_pass_through_from_env_and_flags(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ASEARCHER_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("ASEARCHER_KAFKA_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("ASEARCHER_BOOTSTRAP_SERVERS", "kafka-1:9093,kafka-2:9093")
    settings = kafka_settings(client_options=["sasl.username=bob", "security.protocol=SSL"])
    assert settings.external
    assert settings.client()["bootstrap.servers"] == "kafka-1:9093,kafka-2:9093"
    assert settings.client_config == {
        "security.protocol": "SSL",  # the flag wins over the environment
        "sasl.mechanism": "PLAIN",
        "sasl.username": "bob",
    }


def test_without_a_cluster_the_local_broker_of_the_home_is_used(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("ASEARCHER_BOOTSTRAP_SERVERS", raising=False)
    (tmp_path / "broker.json").write_text('{"bootstrap_servers": "127.0.0.1:19999"}')
    settings = kafka_settings(home=tmp_path)
    assert not settings.external and settings.bootstrap_servers == "127.0.0.1:19999"
    assert client_options_from_env({"ASEARCHER_KAFKA_": "x", "OTHER": "y"}) == {}


def test_a_claims_url_that_cannot_work_is_a_settings_error(tmp_path) -> None:
    with pytest.raises(SettingsError, match="claims URL 'nope://x'"):
        claim_store("nope://x")
    assert claim_store(home=tmp_path).base_url == (tmp_path / "claims").as_uri()


@pytest.mark.slow
def test_the_wheel_holds_every_subpackage_and_the_broker_files(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        check=True, timeout=300,
    )  # fmt: skip
    [wheel] = tmp_path.glob("asearcher-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("streams/wire/events.py", "cli/app.py", "producers/__init__.py",
                   "consumers/__init__.py", "trainer/__init__.py",
                   "infra/kafka/pom.xml", "infra/kafka/log4j2.properties"):  # fmt: skip
        assert f"asearcher/{module}" in names
    assert not any(name.startswith(("tests/", "asearcher/tests/")) for name in names)
    # The installed layout works from anywhere, without the checkout on the path.
    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    result = subprocess.run(
        [sys.executable, "-I", "-c",
         f"import sys; sys.path.insert(0, {str(unpacked)!r}); "
         "from asearcher.cli.app import main; sys.argv = ['asearcher', '--help']; main()"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "stream" in result.stdout


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text().splitlines()
    fence = readme.index("```bash")
    run_line, test_line = (line.split("#")[0].strip() for line in readme[fence + 1 : fence + 3])
    assert run_line.endswith("asearcher learn")
    ci_commands = [
        line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith(("#", "set ", "cd "))
    ]  # fmt: skip
    assert ci_commands == [test_line]
