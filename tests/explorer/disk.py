"""A power cut for files: what was not fsynced is lost.

Every ``os.fsync`` of the process is recorded (``install``): a file fsynced keeps its
content, a directory fsynced keeps the entries it had at that moment. ``power_cut``
then applies what a crash of the machine does to the warehouse: a file whose directory
entry was never made durable disappears (and so does everything under a directory whose
own entry was not), and a file whose entry is durable but whose content is not is left
empty. The database is not touched: SQLite runs with ``synchronous=FULL`` and
PostgreSQL with its WAL, so what they committed survives.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

_real_fsync = os.fsync


class Ledger:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.lock = threading.Lock()
        self.content: set[str] = set()
        self.entries: dict[str, set[str]] = {}
        self.baseline()

    def baseline(self) -> None:
        """Everything on disk now is durable (the world as it was set up)."""
        with self.lock:
            for dirpath, dirs, files in os.walk(self.root):
                self.entries[dirpath] = set(dirs) | set(files)
                self.content |= {os.path.join(dirpath, f) for f in files}
            self.entries.setdefault(str(self.root.parent), set()).add(self.root.name)

    def fsynced(self, fd: int) -> None:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        with self.lock:
            if os.path.isdir(path):
                try:
                    self.entries[path] = set(os.listdir(path))
                except OSError:
                    pass
            else:
                self.content.add(path)

    def _entry_durable(self, path: str) -> bool:
        parent, name = os.path.split(path)
        if path == str(self.root):
            return True
        return name in self.entries.get(parent, set()) and self._entry_durable(parent)

    def power_cut(self) -> dict[str, int]:
        """Apply the loss to the warehouse; returns what was lost."""
        lost = {"files": 0, "emptied": 0, "dirs": 0}
        with self.lock:
            for dirpath, dirs, files in os.walk(self.root, topdown=True):
                for d in list(dirs):
                    full = os.path.join(dirpath, d)
                    if not self._entry_durable(full):
                        shutil.rmtree(full, ignore_errors=True)
                        dirs.remove(d)
                        lost["dirs"] += 1
                for f in files:
                    full = os.path.join(dirpath, f)
                    if not self._entry_durable(full):
                        os.unlink(full)
                        lost["files"] += 1
                    elif full not in self.content and os.path.getsize(full):
                        os.truncate(full, 0)
                        lost["emptied"] += 1
        self.content.clear()
        self.entries.clear()
        self.baseline()
        return lost


_ledgers: list[Ledger] = []
_installed = threading.Lock()


def install(ledger: Ledger) -> None:
    """Record every fsync of the process in ``ledger`` (until ``uninstall``)."""
    with _installed:
        _ledgers.append(ledger)
        os.fsync = _tracked


def uninstall(ledger: Ledger) -> None:
    with _installed:
        if ledger in _ledgers:
            _ledgers.remove(ledger)
        if not _ledgers:
            os.fsync = _real_fsync


def _tracked(fd: int) -> None:
    # The ledger decides what a power cut keeps: the real fsync would only cost time.
    for ledger in list(_ledgers):
        ledger.fsynced(fd)
