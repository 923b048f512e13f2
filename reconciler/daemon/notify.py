"""systemd notification protocol (``sd_notify``), without libsystemd.

Every call is a no-op when ``NOTIFY_SOCKET`` is unset, so the daemon behaves the same
under systemd, in a terminal and in tests (which pass a socket of their own).
"""

from __future__ import annotations

import os
import socket


def notify(*fields: str) -> bool:
    """Send ``READY=1``, ``STATUS=...``, ``WATCHDOG=1``, ``RELOADING=1``, ``STOPPING=1``..."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):
        path = "\0" + path[1:]  # abstract namespace socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(path)
            sock.sendall("\n".join(fields).encode())
        return True
    except OSError:
        return False


def watchdog_interval() -> float | None:
    """Half the watchdog timeout systemd asked for (``WatchdogSec``), or None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and int(pid) != os.getpid()):
        return None
    return int(usec) / 1e6 / 2
