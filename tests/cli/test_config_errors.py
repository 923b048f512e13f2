"""Configuration mistakes (issue 29): one line naming the setting, exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reconciler import settings as settings_mod

RECONCILER = Path(sys.executable).with_name("reconciler")


def _run(tmp_path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RECONCILER_CONFIG": str(tmp_path / "none.yaml")}
    (tmp_path / "none.yaml").write_text("{}\n")
    return subprocess.run([str(RECONCILER), *args], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=clean | (env or {}))


@pytest.mark.parametrize("args, env, setting, says", [
    (["--state-dir", "{blocked}/state", "apply"], {}, "setting stateDir (--state-dir, RECONCILER_STATE_DIR)",
     "cannot create"),
    (["--state-dir", "{blocked}/state", "run"], {}, "setting stateDir (--state-dir, RECONCILER_STATE_DIR)",
     "cannot create"),
    (["--segments", "{blocked}/segments", "--state-dir", "{tmp}/state", "run"], {},
     "setting segments (--segments, RECONCILER_SEGMENTS)", "cannot create"),
    (["--db", "postgres://reconciler:pw-SECRET@db/reconciler", "status"], {}, "setting db (--db, RECONCILER_DB)",
     "the SQLAlchemy name of PostgreSQL is postgresql://, not postgres://"),
    (["status"], {"RECONCILER_DB": "postgresql://u:pw-SECRET@db:port/x"}, "setting db (--db, RECONCILER_DB)",
     "its port is not a number"),
    (["--http", "127.0.0.1:metrics", "run"], {}, "setting http (--http, RECONCILER_HTTP)", "with a port number"),
    (["--tick-interval", "soon", "plan"], {}, "setting tick_interval", "is not a number or duration"),
    (["--secret-env", "A-B", "validate"], {}, "setting secretEnv", "is not an environment variable name"),
])
def test_a_configuration_mistake_is_one_line_exit_2(tmp_path, args, env, setting, says):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a directory should be")
    args = [a.format(blocked=blocked, tmp=tmp_path) for a in args]
    r = _run(tmp_path, *args, env=env)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"Error: {setting}") and says in line, line
    assert "pw-SECRET" not in r.stderr + r.stdout


def test_the_settings_checks_themselves(tmp_path, monkeypatch):
    monkeypatch.setattr(settings_mod, "DEFAULT_CONFIG", tmp_path / "none.yaml")
    settings_mod.check_http("")  # disabled
    settings_mod.check_http(":0")
    settings_mod.check_db("postgresql+psycopg://u@h/db")
    settings_mod.check_db("sqlite:////var/lib/x.db")
    with pytest.raises(settings_mod.PermanentError, match="unknown database kind 'mysqlx'"):
        settings_mod.check_db("mysqlx://h/db")
