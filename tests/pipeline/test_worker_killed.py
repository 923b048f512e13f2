"""A Python worker (or its daemon) killed mid-task fails that job only: the next jobs run (Unix sockets)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _kill_worker(it):
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
    yield from it


def _kill_daemon(it):
    import os
    import signal

    os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
    yield from it


def _pid(it):
    import os

    for x in it:
        yield (x, os.getpid(), os.getppid())


@pytest.mark.parametrize("kill", [_kill_worker, _kill_daemon])
def test_the_next_job_runs_after_a_python_worker_is_killed(spark, kill):
    sc = spark.sparkContext
    print(sc.parallelize(range(4), 4).mapPartitions(_pid).collect())
    with pytest.raises(Exception):  # noqa: B017
        sc.parallelize(range(2), 2).mapPartitions(kill).collect()
    for _ in range(3):
        rows = sc.parallelize(range(4), 4).mapPartitions(_pid).collect()
        print(rows)
        assert [r[0] for r in rows] == [0, 1, 2, 3]
    assert spark.range(0, 4, 1, 4).count() == 4
