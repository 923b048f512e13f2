"""Is the database's schema already at the newest revision? Answered without alembic.

``Store.migrate`` (alembic's ``upgrade head``) is idempotent but costs a third of a second
in a short CLI process, most of it importing alembic (and the SQL dialects, Mako and
Pygments it pulls in). A command that finds the schema current skips it; every other
case (no database yet, an older or unknown revision, several heads, a file this module
cannot read) still goes through ``migrate``, so what happens there is unchanged.
"""

from __future__ import annotations

import re
from pathlib import Path

import sqlalchemy as sa

VERSIONS = Path(__file__).parent / "migrations" / "versions"
_REVISION = re.compile(r"""^revision\s*(?::[^=]*)?=\s*["']([^"']+)["']\s*$""", re.M)
_DOWN = re.compile(r"""^down_revision\s*(?::[^=]*)?=\s*(None|["']([^"']+)["'])\s*$""", re.M)


def head_revision(versions: Path = VERSIONS) -> str | None:
    """The single head of the migration scripts, or None when it cannot be told for sure
    (a branch, a merge, a script whose revision lines are not plain literals)."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in sorted(versions.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        rev, down = _REVISION.findall(text), _DOWN.findall(text)
        if len(rev) != 1 or len(down) != 1:
            return None
        revisions.add(rev[0])
        if down[0][0] != "None":
            parents.add(down[0][1])
    heads = revisions - parents
    return next(iter(heads)) if len(heads) == 1 and parents <= revisions else None


def is_current(engine: sa.Engine) -> bool:
    """True only when the database holds exactly one revision and it is the scripts' head."""
    head = head_revision()
    if head is None:
        return False
    try:
        with engine.connect().execution_options(readonly=True) as conn, conn.begin():
            rows = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all()
    except sa.exc.SQLAlchemyError:  # no table yet, no database, unreachable: migrate says what is wrong
        return False
    return rows == [head]
