"""Spark's class archive: built by a throwaway JVM, mapped by local sessions' JVMs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from reconciler.pipeline import sparkcds


def test_no_archive_no_options(tmp_path):
    assert sparkcds.archive_path(tmp_path).parent == tmp_path / "share" / "stream-reconciler"
    assert sparkcds.java_options(tmp_path) is None
    spaced = tmp_path / "with space"
    path = sparkcds.archive_path(spaced)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x")
    assert sparkcds.java_options(spaced) is None  # Spark's option string cannot carry it


@pytest.mark.integration
def test_a_built_archive_is_mapped_by_a_session_jvm(tmp_path):
    # built by a process of its own, as scripts/setup.sh does (this one already runs a JVM)
    built = subprocess.run([sys.executable, "-m", "reconciler.pipeline.sparkcds", "--prefix", str(tmp_path)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    path = sparkcds.archive_path(tmp_path)
    assert f"Spark class archive: {path}" in built.stdout
    assert path.is_file() and path.stat().st_size > 1_000_000
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary leftovers
    options = sparkcds.java_options(tmp_path)
    assert options is not None and str(path) in options
    # -Xshare:on: the JVM refuses to start unless it maps the archive (auto would go on without)
    child = textwrap.dedent(f"""
        from reconciler.pipeline import spark as sp, sparkconf
        sparkconf.ARCHIVE_OPTIONS_ENABLED = False
        sparkconf.STATIC_CONF["spark.driver.defaultJavaOptions"] += " " + {options!r}.replace("-Xshare:auto", "-Xshare:on")
        print("rows", sp.get_session(master="local[1]").range(3).count())
        sp.stop_session()
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and "rows 3" in done.stdout, (done.stdout + done.stderr)[-3000:]


def test_building_beside_a_running_session_is_refused(spark, tmp_path):
    with pytest.raises(RuntimeError, match="already runs"):
        sparkcds.build(tmp_path)
    assert not (tmp_path / "share").exists() or not any((tmp_path / "share").rglob("*.jsa"))


def test_local_sessions_map_the_installed_archive(spark):
    installed = sparkcds.java_options()
    if installed is None:
        pytest.skip("no archive in this virtualenv: scripts/setup.sh builds it")
    args = list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={sparkcds.archive_path()}" in args, args
