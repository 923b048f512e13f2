"""Peak resident memory of a process tree (the daemon: Python, its Spark JVM, the JVM's
Python workers), sampled from /proc while a benchmark runs.

Two sums: RSS counts a page once per process that maps it, so the Python workers that
Spark forks from one daemon (sharing its imported modules copy-on-write) are counted
several times over; PSS (``/proc/<pid>/smaps_rollup``) splits each shared page among the
processes that share it, so its sum is the memory the tree really occupies."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def _rss(pid: int) -> int:
    try:
        return int((Path("/proc") / str(pid) / "statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _pss(pid: int) -> int:
    try:
        for line in (Path("/proc") / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):  # exited between the listing and the read
        pass
    return 0


def _tree(root: int, exclude: frozenset[int]) -> list[int]:
    children, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        if pid in exclude:
            continue
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


class PeakRss:
    """``with PeakRss(pid) as peak: ...`` then ``peak.mib`` and ``peak.pss_mib``: the
    largest tree RSS and PSS seen.

    The sampler shares the machine with what it measures, so it keeps its own cost down
    (about 1.5% of a core instead of 7-10%): RSS (one ``statm`` read per process) every
    ``every`` seconds; the process tree (a read of every ``/proc/<pid>/stat``) and PSS
    (``smaps_rollup``, which walks the page tables: ~14 ms for a Spark JVM) every
    ``slow_every`` seconds. Spark reuses its Python workers, so a tree a second old
    misses at most a worker's first second; the last sample, on exit, is a full one."""

    def __init__(self, root: int, exclude: frozenset[int] = frozenset(), every: float = 0.25,
                 slow_every: float = 1.0):
        self.root, self.exclude, self.every, self.slow_every = root, exclude, every, slow_every
        self.peak = 0
        self.peak_pss = 0
        self._pids: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)

    def _run(self) -> None:
        last_slow = float("-inf")
        while not self._stop.is_set():
            now = time.monotonic()
            if now - last_slow >= self.slow_every:
                self._sample()
                last_slow = now
            else:
                self._sample_rss()
            self._stop.wait(self.every)

    def _sample_rss(self) -> None:
        self.peak = max(self.peak, sum(_rss(pid) for pid in self._pids))

    def _sample(self) -> None:
        self._pids = _tree(self.root, self.exclude)
        self._sample_rss()
        self.peak_pss = max(self.peak_pss, sum(_pss(pid) for pid in self._pids))

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def mib(self) -> float:
        return round(self.peak / 2**20, 1)

    @property
    def pss_mib(self) -> float:
        return round(self.peak_pss / 2**20, 1)
