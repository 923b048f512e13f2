"""The private SPARK_HOME: a mirror of the installed pyspark without pyspark.zip, so the
planner's Python workers import pyspark from the virtualenv (cached bytecode)."""

from __future__ import annotations

import os

import pyspark
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from reconciler.pipeline import sparkhome


def _fake_pyspark(root):
    src = root / "pyspark"
    (src / "bin").mkdir(parents=True)
    (src / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    (src / "jars").mkdir()
    (src / "python" / "lib").mkdir(parents=True)
    (src / "python" / "lib" / "pyspark.zip").write_bytes(b"zip")
    (src / "python" / "lib" / "py4j-0.10.9.9-src.zip").write_bytes(b"zip")
    (src / "__init__.py").write_text("")
    return src


def test_the_mirror_links_everything_but_the_pyspark_zip(tmp_path):
    src = _fake_pyspark(tmp_path)
    home = sparkhome.private_home(src, tmp_path)
    assert (home / "bin").resolve() == src / "bin"
    assert (home / "jars").resolve() == src / "jars"
    assert (home / "__init__.py").is_symlink()
    assert sorted(p.name for p in (home / "python" / "lib").iterdir()) == ["py4j-0.10.9.9-src.zip"]
    assert os.stat(home).st_mode & 0o077 == 0
    assert sparkhome.private_home(src, tmp_path) == home  # built once, found again
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no half-built leftovers


def test_a_directory_others_may_write_is_not_trusted(tmp_path):
    src = _fake_pyspark(tmp_path)
    home = sparkhome.private_home(src, tmp_path)
    os.chmod(home, 0o777)  # as if someone else had prepared it: rebuilt, not used
    rebuilt = sparkhome.private_home(src, tmp_path)
    assert rebuilt == home and os.stat(home).st_mode & 0o077 == 0


def test_an_operators_spark_home_is_kept():
    env = {"SPARK_HOME": "/opt/spark"}
    assert sparkhome.use_private_home(env) is None
    assert env == {"SPARK_HOME": "/opt/spark"}


class _WhereSource(DataSource):
    """Reports where the planner worker (which runs ``partitions()``) imported pyspark from."""

    @classmethod
    def name(cls):
        return "where_is_pyspark"

    def schema(self):
        return "path string"

    def reader(self, schema):
        return _WhereReader()


class _WhereReader(DataSourceReader):
    def partitions(self):
        import pyspark as planner_pyspark

        return [InputPartition(planner_pyspark.__file__)]

    def read(self, partition):
        yield (partition.value,)


def test_planner_workers_import_pyspark_from_the_virtualenv(spark):
    spark.dataSource.register(_WhereSource)
    (row,) = spark.read.format("where_is_pyspark").load().collect()
    assert ".zip" not in row.path, row.path
    assert os.path.realpath(row.path) == os.path.realpath(pyspark.__file__)
