"""The session settings that remove a batch's fixed costs (issue 12), without a session.

- Python workers import pyspark from the virtualenv (cached bytecode), not from Spark's
  ``pyspark.zip`` (compiled again in every worker process): ``worker_daemon_path``.
- The daemon module applies to local masters only; the plain local filesystem (no .crc
  side files, half the forked ``chmod``s) to every classic session. An operator's
  ``spark:`` map still overrides each of them.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pyspark

from reconciler.pipeline import sparkconf as sp
from reconciler.pipeline import sparkworker

LIB = Path(pyspark.__file__).parent / "python" / "lib"


def _zips() -> list[str]:
    return [str(LIB / "pyspark.zip"), *map(str, sorted(LIB.glob("py4j-*-src.zip")))]


def test_spark_zips_move_behind_the_installed_pyspark():
    zips = _zips()
    assert Path(zips[0]).is_file()
    path = [*zips, "/somewhere", *sys.path]
    out = sparkworker.worker_daemon_path(path)
    assert out[-len(zips):] == zips  # kept, as a fallback, but last
    assert sorted(out) == sorted(path)
    assert out.index("/somewhere") == 0


def test_a_different_pyspark_in_the_zip_keeps_the_path(tmp_path):
    other = tmp_path / "pyspark.zip"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("pyspark/__init__.py", "")
        zf.writestr("pyspark/version.py", '__version__ = "0.0.1"\n')
    path = [str(other), *sys.path]
    assert sparkworker.worker_daemon_path(path) == path


def test_no_zip_no_change():
    assert sparkworker.worker_daemon_path(list(sys.path)) == list(sys.path)


def test_workers_import_pyspark_from_the_virtualenv():
    """What the daemon module does to a worker's path: pyspark comes from site-packages."""
    code = (
        "import sys; from reconciler.pipeline.sparkworker import worker_daemon_path as w; "
        "sys.path[:] = w(sys.path); import pyspark; print(pyspark.__file__)"
    )
    env_path = ":".join(_zips())
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"}).stdout.strip()
    assert ".zip" not in out and out.endswith("pyspark/__init__.py")


def test_local_settings_apply_to_local_masters_only():
    assert sp.LOCAL_CONF["spark.python.daemon.module"] == sp.DAEMON_MODULE
    assert sp.DAEMON_MODULE == "reconciler.pipeline.sparkworker"
    assert all(k.startswith("spark.") for k in sp.LOCAL_CONF)
    assert "spark.python.daemon.module" not in sp.STATIC_CONF  # not on a cluster


def test_no_checksum_side_files():
    assert sp.STATIC_CONF["spark.hadoop.fs.file.impl"] == "org.apache.hadoop.fs.RawLocalFileSystem"
