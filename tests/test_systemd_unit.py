"""systemd/stream-reconciler.service and examples/etc/config.yaml, checked.

* the unit declares what ``reconciler run`` implements: Type=notify (READY, STATUS,
  WATCHDOG, RELOADING, STOPPING; see tests/daemon/test_notify.py), a watchdog, reload by
  SIGHUP, a dedicated user, StateDirectory and ConfigurationDirectory, Restart=on-failure;
* its hardening leaves out what breaks the JVM (MemoryDenyWriteExecute: the JIT needs
  writable+executable pages);
* ``systemd-analyze verify`` accepts it (with ExecStart pointed at this virtualenv's
  ``reconciler``, since /opt/stream-reconciler does not exist here), and
  ``systemd-analyze security --offline=true`` rates it well;
* the config example loads, documents every setting, and the unit's command line parses.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from reconciler import settings as settings_mod

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "systemd" / "stream-reconciler.service"
CONFIG = ROOT / "examples" / "etc" / "config.yaml"
INSTALLED_BIN = "/opt/stream-reconciler/bin/reconciler"  # scripts/install.sh's virtualenv
VENV_BIN = Path(sys.executable).with_name("reconciler")


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> values (a key may repeat); comments and blank lines skipped."""
    out: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out[section][key.strip()].append(value.strip())
    return out


@pytest.fixture(scope="module")
def unit():
    return parse_unit(UNIT.read_text())


def one(unit, key: str, section: str = "Service") -> str:
    values = unit[section][key]
    assert len(values) == 1, f"{key}: {values}"
    return values[0]


def test_the_unit_declares_what_the_daemon_implements(unit):
    assert one(unit, "Type") == "notify"
    assert one(unit, "NotifyAccess") == "main"
    assert one(unit, "Restart") == "on-failure"
    assert one(unit, "ExecReload") == "/bin/kill -HUP $MAINPID"
    assert re.fullmatch(r"\d+s", one(unit, "WatchdogSec"))
    assert int(one(unit, "WatchdogSec")[:-1]) >= 10  # the loop pings every second
    assert one(unit, "KillMode") == "mixed"
    assert one(unit, "TimeoutStopSec")
    assert one(unit, "StateDirectory") == "stream-reconciler"
    assert one(unit, "ConfigurationDirectory") == "stream-reconciler"
    assert one(unit, "User") == "stream-reconciler" and one(unit, "Group") == "stream-reconciler"
    assert one(unit, "ExecStart") == f"{INSTALLED_BIN} --config /etc/stream-reconciler/config.yaml run"
    assert one(unit, "WantedBy", "Install") == "multi-user.target"


def test_hardening_leaves_the_jvm_what_it_needs(unit):
    service = unit["Service"]
    assert "MemoryDenyWriteExecute" not in service  # the JIT writes executable code
    assert "ProcSubset" not in service  # /proc/meminfo and /proc/cpuinfo are read by the JVM
    assert "PrivateNetwork" not in service  # brokers and databases are on the network
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices", "RestrictSUIDSGID"):
        assert one(unit, key) == "yes", key
    assert one(unit, "ProtectSystem") == "strict"
    families = one(unit, "RestrictAddressFamilies").split()
    assert {"AF_INET", "AF_INET6", "AF_UNIX"} <= set(families)
    assert one(unit, "CapabilityBoundingSet") == ""
    rw = one(unit, "ReadWritePaths").split()
    # the state directory and the spec checkout that scripts/install.sh creates, both required
    # (a "-" path that is missing would be skipped silently and leave the daemon blind)
    assert rw == ["/var/lib/stream-reconciler", "/srv/stream-reconciler/specs"]
    assert one(unit, "StateDirectoryMode") == "0750"


def _local_copy(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this virtualenv (verify checks the binary exists)."""
    assert VENV_BIN.exists()
    text = UNIT.read_text().replace(INSTALLED_BIN, str(VENV_BIN))
    path = tmp_path / UNIT.name
    path.write_text(text)
    return path


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_verify(tmp_path):
    path = _local_copy(tmp_path)
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True,
                       timeout=60)
    output = (r.stdout + r.stderr).strip()
    assert r.returncode == 0, output
    ours = [line for line in output.splitlines() if UNIT.name in line]
    assert not ours, output


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_security_rates_the_unit_well(tmp_path):
    path = _local_copy(tmp_path)
    r = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: ([\d.]+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= 2.5, r.stdout  # 0 = locked down, 10 = exposed


def test_the_config_example_loads_and_documents_every_setting():
    s = settings_mod.load({}, config=str(CONFIG), env={})
    assert s.specs == "/srv/stream-reconciler/specs"
    assert s.state_dir == "/var/lib/stream-reconciler"
    assert (s.tick_interval, s.lease_ttl, s.http) == (30.0, 15.0, "127.0.0.1:9187")
    text = CONFIG.read_text()
    for _name, _env, key, _help in settings_mod.describe():
        assert re.search(rf"^#?\s*{key}:", text, re.MULTILINE), f"setting {key} is not in {CONFIG.name}"
    # the state dir of the example is the unit's StateDirectory
    assert s.state_dir == "/var/lib/" + parse_unit(UNIT.read_text())["Service"]["StateDirectory"][0]


def test_the_units_command_line_parses(tmp_path):
    r = subprocess.run([str(VENV_BIN), "--config", str(CONFIG), "run", "--help"], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "SIGTERM" in r.stdout
