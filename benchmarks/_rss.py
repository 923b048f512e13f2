"""Peak resident memory of a process tree (the daemon: Python, its Spark JVM, the JVM's
Python workers), sampled from /proc while a benchmark runs."""

from __future__ import annotations

import os
import threading
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


def tree_rss(root: int, exclude: frozenset[int] = frozenset()) -> int:
    """Bytes resident in ``root`` and its descendants, without the subtrees of ``exclude``."""
    children, total, todo = _children(), 0, [root]
    while todo:
        pid = todo.pop()
        if pid in exclude:
            continue
        total += _rss(pid)
        todo.extend(children.get(pid, ()))
    return total


class PeakRss:
    """``with PeakRss(pid) as peak: ...`` then ``peak.mib``: the largest tree RSS seen,
    sampled every ``every`` seconds."""

    def __init__(self, root: int, exclude: frozenset[int] = frozenset(), every: float = 0.25):
        self.root, self.exclude, self.every = root, exclude, every
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self.root, self.exclude))
            self._stop.wait(self.every)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_rss(self.root, self.exclude))

    @property
    def mib(self) -> float:
        return round(self.peak / 2**20, 1)
