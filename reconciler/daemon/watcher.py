"""The spec-directory watcher: when files changed, and whether the directory has settled.

An editor's atomic save or a ``git checkout`` of many files is a burst of events; a pass
waits until no event came for ``debounce`` seconds and no ``.git/index.lock`` exists, so it
reads the final files, not half a change. A directory that never settles (endless events,
a stale lock) holds passes back at most ``MAX_HOLD`` seconds.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from reconciler.daemon.waker import Waker

# Every part of the daemon logs as "reconciler.daemon": the name is in each line, and
# operators' filters and the tests' caplog select on it.
log = logging.getLogger("reconciler.daemon")

MAX_HOLD = 30.0  # seconds a busy directory (endless events, a stale .git/index.lock) may hold passes back


class SpecWatcher:
    """watchdog events on the spec directory: a counter, the time of the last event, and
    whether the directory is busy (events still coming, or a git operation under way)."""

    def __init__(self, directory: str, wake: Waker):
        self.directory = directory
        self.wake = wake
        self.events = 0
        self.last_event: float | None = None
        self._blocked_since: float | None = None
        self._warned = False
        self._observer = None

    def start(self) -> SpecWatcher:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                if event.event_type in ("opened", "closed_no_write"):
                    return
                watcher.events += 1
                watcher.last_event = time.monotonic()
                watcher.wake.set()

        if not Path(self.directory).is_dir():
            log.warning("spec directory %s does not exist; relying on the periodic tick", self.directory)
            return self
        self._observer = Observer()
        self._observer.schedule(Handler(), self.directory, recursive=False)
        self._observer.daemon = True
        self._observer.start()
        return self

    def pending(self) -> bool:
        return self.last_event is not None

    def git_busy(self) -> bool:
        return (Path(self.directory) / ".git" / "index.lock").exists()

    def blocked(self, debounce: float) -> bool:
        """A pass now could see a half-written directory. Held back at most MAX_HOLD seconds."""
        now = time.monotonic()
        busy = self.git_busy() or (self.last_event is not None and now - self.last_event < debounce)
        if not busy:
            self._blocked_since, self._warned = None, False
            return False
        if self._blocked_since is None:
            self._blocked_since = now
        if now - self._blocked_since < MAX_HOLD:
            return True
        if not self._warned:
            log.warning("spec directory %s has been busy for %.0fs (a stale .git/index.lock?); reconciling anyway",
                        self.directory, now - self._blocked_since)
            self._warned = True
        return False

    def wait_hint(self, debounce: float) -> float | None:
        """Seconds until pending events have settled, or None without pending events."""
        if self.last_event is None:
            return None
        return max(0.02, self.last_event + debounce - time.monotonic())

    def consume(self) -> int:
        """Forget pending events (a pass starts now); returns a mark for ``unchanged_since``."""
        self.last_event = None
        return self.events

    def unchanged_since(self, mark: int) -> bool:
        return self.events == mark and not self.blocked(0.0)

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
