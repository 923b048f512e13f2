"""``store.schema``: a read-only command skips alembic when the schema is already current
(issue 15: ``status --no-lag`` over 1,000 supervisors within a second, imports included).

* the head read from the migration scripts is alembic's own head;
* ``is_current`` only for a database at exactly that revision (not for a missing table,
  an older revision or an unknown one): every other case still goes through ``migrate``;
* ``reconciler status --no-lag`` imports neither alembic nor pyarrow (nor numpy, the
  planner, pyspark or a broker client); a database that is behind is refused with the way
  out (``reconciler db upgrade``) and left as it is: a read-only command never migrates a
  schema under a daemon of the older version (issue 35).
"""

from __future__ import annotations

import json
import subprocess
import sys

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from reconciler.store.schema import head_revision, is_current
from reconciler.store.store import MIGRATIONS, Store
from tests.e2e import helpers


def test_head_is_alembics_head():
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    assert head_revision() == ScriptDirectory.from_config(cfg).get_current_head()


def test_current_only_at_the_head(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        assert not is_current(store.engine)  # never migrated: no alembic_version table
        store.migrate()
        assert is_current(store.engine)
        with store.engine.begin() as c:
            c.exec_driver_sql("UPDATE alembic_version SET version_num = 'older'")
        assert not is_current(store.engine)
    finally:
        store.close()


_PROBE = """
import json, sys
from reconciler.cli import main
sys.argv = ["reconciler", "status", "--no-lag", "-o", "json"]
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code
heavy = ["alembic", "pyarrow", "numpy", "reconciler.control.plan", "pyspark", "confluent_kafka", "rstream"]
print(json.dumps({"exit": code, **{m: m in sys.modules for m in heavy}}), file=sys.stderr)
"""


def _probe(settings) -> tuple[str, str, dict]:
    env = {**helpers.settings_env(settings), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    return proc.stdout, "\n".join(lines[:-1]), json.loads(lines[-1])


def test_status_imports_only_what_it_needs_and_refuses_an_older_schema(tmp_path):
    s = helpers.make_settings(tmp_path)
    s.state_path.mkdir(parents=True, exist_ok=True)
    store = Store(s.db_url)
    try:
        store.migrate()
        out, _, probed = _probe(s)
        exit_code = probed.pop("exit")
        assert exit_code in (0, None) and json.loads(out)["supervisors"] == [], out
        assert not any(probed.values()), probed
        with store.engine.begin() as c:  # a database one revision behind
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS))
            cfg.attributes["connection"] = c
            command.downgrade(cfg, "-1")
        assert not is_current(store.engine)
        behind = store.revision()
        out, err, probed = _probe(s)
        assert probed.pop("exit") == 1 and out == ""
        assert "reconciler db upgrade" in err and f"schema revision {behind}" in err, err
        assert not any(probed.values()), probed
        assert store.revision() == behind  # left as it was
    finally:
        store.close()
