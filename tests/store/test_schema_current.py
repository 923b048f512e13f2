"""``store.schema``: a read-only command skips alembic when the schema is already current
(issue 15: ``status --no-lag`` over 1,000 supervisors within a second, imports included).

* the head read from the migration scripts is alembic's own head;
* ``is_current`` only for a database at exactly that revision (not for a missing table,
  an older revision or an unknown one): every other case still goes through ``migrate``;
* ``reconciler status --no-lag`` imports neither alembic nor pyarrow (nor numpy, the
  planner, pyspark or a broker client), and still upgrades a database that is behind.
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
try:
    main()
except SystemExit:
    pass
heavy = ["alembic", "pyarrow", "numpy", "reconciler.control.plan", "pyspark", "confluent_kafka", "rstream"]
print(json.dumps({m: m in sys.modules for m in heavy}), file=sys.stderr)
"""


def _probe(settings) -> tuple[dict, dict]:
    env = {**helpers.settings_env(settings), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), json.loads(proc.stderr.strip().splitlines()[-1])


def test_status_imports_only_what_it_needs_and_still_upgrades(tmp_path):
    s = helpers.make_settings(tmp_path)
    s.state_path.mkdir(parents=True, exist_ok=True)
    store = Store(s.db_url)
    try:
        store.migrate()
        doc, imported = _probe(s)
        assert doc["supervisors"] == [] and not any(imported.values()), imported
        with store.engine.begin() as c:  # a database one revision behind is upgraded, as before
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS))
            cfg.attributes["connection"] = c
            command.downgrade(cfg, "-1")
        assert not is_current(store.engine)
        doc, imported = _probe(s)
        assert imported["alembic"] and is_current(store.engine)
    finally:
        store.close()
