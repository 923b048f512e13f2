"""The daemon loop's alarm clock: a self-pipe that threads and signal handlers can ring.

``threading.Event`` cannot be set from a signal handler: the handler runs in the main
thread between two bytecodes, possibly while that thread is inside ``Event.set`` or
``Event.wait`` holding the event's (non-reentrant) lock, and a second acquire from the
handler deadlocks the loop for good (a burst of SIGHUPs did exactly that). ``ring`` is one
non-blocking ``os.write`` to a pipe, which is safe anywhere: in a signal handler, in the
watchdog thread, in a runtime thread. ``wait`` is a ``select`` on the pipe's other end.
"""

from __future__ import annotations

import os
import select


class Waker:
    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def ring(self) -> None:
        """Wake the loop (idempotent: a full pipe already says "wake up"); after ``close``, nothing."""
        fd = self._write
        if fd < 0:  # closed: the number may already name someone else's file
            return
        try:
            os.write(fd, b"!")
        except (BlockingIOError, OSError):
            pass

    # ``threading.Event``'s name, so watchers and tests that were handed an event still work.
    set = ring

    def wait(self, timeout: float | None) -> bool:
        """Sleep until rung or ``timeout`` seconds passed; True when rung. Clears the bell."""
        try:
            ready, _, _ = select.select([self._read], [], [], max(0.0, timeout) if timeout is not None else None)
        except InterruptedError:  # a signal arrived: its handler rang (or will ring) the bell
            ready = [self._read]
        self.clear()
        return bool(ready)

    def clear(self) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        fds = (self._read, self._write)
        self._write = -1  # first: a late ring (a runtime thread, a signal) must not write to a reused number
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
