"""Every command says a broker that is down once, in its own words (issue 46, the newcomer's
third look: ``reset clicks --to latest`` printed librdkafka's ``ERROR ... FAIL [...]
Connection refused`` before the clean ``Error:``). One mechanism, the CLI's logging setup,
not a silencer per command; ``--log-level DEBUG`` still shows the client's lines.

The broker is a real loopback port nobody listens on, as a dead broker looks to a client.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import devservices

SCRIPT = Path(sys.executable).parent / "reconciler"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "RECONCILER_CONFIG": "/dev/null"}
    return subprocess.run([str(SCRIPT), "--specs", str(tmp_path / "specs"), "--state-dir", str(tmp_path / "state"),
                           "--http", "", *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def dead_broker_specs(tmp_path) -> list[str]:  # the name marks the tests integration (conftest)
    (tmp_path / "specs").mkdir()
    spec = {"id": "clicks", "source": {"type": "kafka", "bootstrapServers": f"127.0.0.1:{devservices.free_port()}",
                                       "topic": "clicks"},
            "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"}}}
    (tmp_path / "specs" / "clicks.yaml").write_text(yaml.safe_dump(spec))
    return ["clicks"]


@pytest.mark.parametrize("args", [
    ("reset", "clicks", "--to", "latest"),
    ("reset", "clicks", "--to", "latest", "--dry-run"),
    ("reset", "clicks", "--to", "-1h", "--dry-run"),
    ("plan",),
], ids=["reset", "reset-dry-run", "reset-to-a-time", "plan"])
def test_a_command_against_a_dead_broker_prints_no_client_line(tmp_path, dead_broker_specs, args):
    assert _run(tmp_path, "apply").returncode == 0
    result = _run(tmp_path, *args)
    assert "librdkafka" not in result.stderr, result.stderr
    assert "ERROR" not in result.stderr, result.stderr
    if args[0] == "reset":
        assert result.returncode == 1
        assert result.stderr.startswith("Error: ") and "cannot reach Kafka" in result.stderr, result.stderr


def test_at_debug_the_client_lines_are_there(tmp_path, dead_broker_specs):
    assert _run(tmp_path, "apply").returncode == 0
    result = _run(tmp_path, "--log-level", "DEBUG", "reset", "clicks", "--to", "latest", "--dry-run")
    assert result.returncode == 1
    lines = [ln for ln in result.stderr.splitlines() if "librdkafka" in ln and "Connection refused" in ln]
    assert lines and all(" DEBUG " in ln for ln in lines), result.stderr


def test_a_command_run_in_process_leaves_the_client_loggers_as_it_found_them(tmp_path):
    import logging

    from click.testing import CliRunner

    from reconciler.cli import cli

    log = logging.getLogger("reconciler.streams.kafka.librdkafka")
    before = log.level
    (tmp_path / "specs").mkdir()
    result = CliRunner().invoke(cli, ["--specs", str(tmp_path / "specs"), "--state-dir", str(tmp_path / "s"),
                                      "validate", str(tmp_path / "specs")], env={"RECONCILER_CONFIG": "/dev/null"})
    assert result.exit_code == 0, result.output
    assert log.level == before  # a daemon started next in this process keeps librdkafka's surprises
