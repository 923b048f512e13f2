"""A SPARK_HOME for local sessions whose Python workers import pyspark with its bytecode.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on every Python worker's path,
and Python never caches the bytecode of modules imported from a zip: each worker that
Spark starts compiles pyspark's sources again. A batch's Arrow tasks avoid it through
``spark.python.daemon.module`` (``reconciler.pipeline.sparkworker``), but workers Spark
starts otherwise (Python data sources' planners, which ran one after another and cost
2.6 s of a fresh process's first batch before batches became Arrow tasks; anything else
a session runs) use ``pyspark.daemon`` whatever that setting says.

A pip-installed pyspark is a complete Spark home. This one mirrors it with symbolic
links, except that ``python/lib`` holds only py4j's zip: the zip entry on the workers'
path then names no file, and they import the virtualenv's pyspark, the very same
installation, from its cached bytecode. Local masters only: a cluster's workers use the
cluster's own home.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

_PYTHON_DIR = "python"


def installed_home() -> Path:
    """The pip-installed pyspark's directory, which is a complete Spark home."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def private_home(source: Path | None = None, parent: Path | None = None) -> Path:
    """The mirror of ``source`` (the installed pyspark) without ``pyspark.zip``, built once
    per installation and user under ``parent`` (the temporary directory); raises
    ``OSError`` when it cannot be built."""
    source = (source or installed_home()).resolve()
    parent = parent or Path(tempfile.gettempdir())
    tag = hashlib.sha256(str(source).encode()).hexdigest()[:12]
    home = parent / f"stream-reconciler-spark-home-{os.getuid()}-{tag}"
    if _complete(home, source):
        return home
    # Built beside and renamed into place: a concurrent process sees all of it or none.
    building = Path(tempfile.mkdtemp(prefix=f".{home.name}-", dir=parent))
    try:
        for entry in source.iterdir():
            if entry.name != _PYTHON_DIR:
                (building / entry.name).symlink_to(entry)
        lib = building / _PYTHON_DIR / "lib"
        lib.mkdir(parents=True)
        for z in (source / _PYTHON_DIR / "lib").glob("py4j-*.zip"):
            (lib / z.name).symlink_to(z)
        (building / ".source").write_text(str(source))
        if home.exists() and not _complete(home, source):
            shutil.rmtree(home, ignore_errors=True)  # a stale or partial one of this name
        try:
            os.rename(building, home)
        except OSError:
            if not _complete(home, source):  # not another process's identical mirror
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return home


def _complete(home: Path, source: Path) -> bool:
    """Ours (a real directory this user owns that no one else may write: the temporary
    directory is shared, and Spark runs what ``bin`` and ``jars`` hold) and finished."""
    try:
        st = home.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            return False
        return (home / ".source").read_text() == str(source) and (home / "bin").resolve() == source / "bin"
    except OSError:
        return False


def use_private_home(env: dict[str, str] | os._Environ = os.environ) -> str | None:
    """Point ``SPARK_HOME`` at the private home unless the operator set one; returns what
    was set (None: left alone, or the mirror could not be built, which only costs time)."""
    if env.get("SPARK_HOME"):
        return None
    try:
        home = str(private_home())
    except OSError as exc:
        log.debug("no private SPARK_HOME (%s): Python workers will import pyspark from its zip", exc)
        return None
    env["SPARK_HOME"] = home
    return home
