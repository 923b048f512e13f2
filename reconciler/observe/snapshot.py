"""One rendering of a status page (or of /metrics) shared by every request that asks for it meanwhile.

With 400 supervisors the status page is half a megabyte and takes a database read and a
render; rendered once per request, a burst of requests cost a burst of renders and kept
the HTTP workers busy long after the burst (issue 41.3). ``SharedRender`` renders a path
once and hands the same text to every request that arrives while that rendering runs or
within ``max_age`` seconds after it finished. The page is a view that refreshes itself: a
second old is as good as new. A rendering that fails is not kept: the requests that waited
for it see its error, the next one tries again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_AGE = 1.0  # seconds a rendered page is served again before the next request renders it anew


@dataclass
class _Entry:
    done: threading.Event = field(default_factory=threading.Event)
    value: str | bytes | None = None
    error: BaseException | None = None
    finished: float = 0.0


class SharedRender:
    """``get(path)`` is ``render(path)``, shared: at most one rendering of a path runs at a
    time, and its result serves every request until it is ``max_age`` seconds old."""

    def __init__(self, render: Callable[[str], str | bytes | None], max_age: float = MAX_AGE) -> None:
        self._render = render
        self.max_age = max_age
        self.renders = 0  # renderings run: what the tests count
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def get(self, path: str) -> str | bytes | None:
        with self._lock:
            now = time.monotonic()
            self._forget_old(now)
            entry = self._entries.get(path)
            mine = entry is None
            if mine:
                entry = self._entries[path] = _Entry()
                self.renders += 1
        if mine:
            self._run(path, entry)
        else:
            entry.done.wait()
        if entry.error is not None:
            raise entry.error
        return entry.value

    def _run(self, path: str, entry: _Entry) -> None:
        try:
            entry.value = self._render(path)
        except BaseException as exc:  # the waiting requests see it too; nothing is kept
            entry.error = exc
            with self._lock:
                self._entries.pop(path, None)
        finally:
            entry.finished = time.monotonic()
            entry.done.set()

    def _forget_old(self, now: float) -> None:
        # one entry per path asked for within max_age: the per-supervisor pages do not pile up
        for path in [p for p, e in self._entries.items() if e.done.is_set() and now - e.finished >= self.max_age]:
            del self._entries[path]
