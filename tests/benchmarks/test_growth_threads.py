"""``benchmarks/growth_daemon.py``'s CPU by thread job: a long run's CPU per minute is read
per job (the daemon's step threads, the benchmark's own producer and sampler), so a growth
is pinned on the job that grows, or on none."""

from __future__ import annotations

import os
import threading
import time

from tests.benchmarks.load import benchmark


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_cpu_is_told_by_thread_job_and_an_ended_thread_is_in_exited():
    growth = benchmark("growth_daemon")
    cpu = growth.ThreadCpu()
    stop = threading.Event()
    spun = threading.Event()

    def spin_then_wait() -> None:
        _spin(0.3)
        spun.set()
        stop.wait(30)

    live = threading.Thread(target=spin_then_wait, name="runtime-a", daemon=True)
    ended = threading.Thread(target=_spin, args=(0.3,), name="runtime-b")
    live.start()
    ended.start()
    ended.join()
    while os.path.exists(f"/proc/self/task/{ended.native_id}"):  # joined, the kernel's thread ends a moment later
        time.sleep(0.01)
    assert spun.wait(30)
    taken = cpu.take()
    stop.set()
    live.join()
    # one job for every step thread of a runtime; the ended one's time is the process's, in exited
    assert 0.2 <= taken.get("runtime", 0.0) <= 0.6, taken
    assert 0.2 <= taken["exited"] <= 0.6, taken
    # the next take counts from this one: nothing spun since
    again = cpu.take()
    assert again.get("runtime", 0.0) < 0.1 and again["exited"] < 0.1, again


def test_thread_names_group_by_job():
    growth = benchmark("growth_daemon")
    assert growth._group("runtime-fresh") == "runtime"
    assert growth._group("Thread-12 (serve_forever)") == "Thread"
    assert growth._group("ThreadPoolExecutor-3_0") == "ThreadPoolExecutor"
    assert growth._group("lag_7") == "lag"
    assert growth._group("growth-sampler") == "growth-sampler"


def test_the_daemons_minute_leaves_out_the_producer_and_the_sampler():
    growth = benchmark("growth_daemon")
    samples = [{"processCpuS": 1.0 * (i + 1), "threadCpuS": {"MainThread": 0.25, "growth-sampler": 0.05,
                                                          "runtime": 0.7}} for i in range(12)]
    threads = growth._threads_per_minute(samples)
    assert threads == {"MainThread": [1.5, 1.5], "growth-sampler": [0.3, 0.3], "runtime": [4.2, 4.2]}
    # a minute is six samples from the sampler's start, the first one too (it was five: 50 s)
    assert growth._per_minute(samples, "processCpuS", {"processCpuS": 0.0}) == [6.0, 6.0]
    assert growth._daemon_per_minute(samples, threads, {"processCpuS": 0.0}) == [4.2, 4.2]
