"""One webhook POST, bounded and contained (issue 41): whatever the receiver answers, or
fails to, the caller gets either nothing (accepted) or a ``DeliveryFailed`` with a message a
person can read in ``reconciler status``; never another exception, never a redirect followed.

* **Every failure is a ``DeliveryFailed``.** ``http.client`` raises more than ``OSError``:
  ``BadStatusLine`` for a garbled answer, ``HTTPException`` for more than 100 header lines,
  ``InvalidURL``, ``LineTooLong``. Any of them escaping would end the endpoint's thread for good
  while ``status`` still said "delivering"; so every exception of an attempt is turned into one.
* **A whole deadline.** A socket timeout bounds each read only: a receiver sending a header
  byte every 4 s would hold a POST with a 5 s timeout for as long as it likes. A watchdog shuts
  the socket down ``TIMEOUT`` seconds after the POST started (connect, TLS, send, answer), which
  wakes the blocked read. Only the name look-up before the connection is not covered.
* **Redirects are never followed.** urllib turns a POST answered 302 into a bodiless GET to
  whatever host the ``Location`` names, and the event counted as delivered. A 3xx here is a
  failure (retried, shown): the operator sets the URL that answers.
* **No credentials, no secrets in messages.** A URL with ``user:password@`` is refused (the
  settings refuse it first, as they refuse spaces and control characters); a message is built
  from an exception's type and ``scheme://host:port``, never from its text, which may quote
  the URL's path (often a token, as Slack's); the receiver's reason phrase is made printable
  and cut short: it is the receiver's text, shown in an operator's terminal.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import socket
import ssl
import threading
import urllib.request
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from reconciler.errors import printable

TIMEOUT = 5.0  # seconds for one POST, whole: connect, send, the answer's status, headers and body
MAX_BODY = 1 << 16  # bytes of an answer's body read (and ignored)
TEXT = 200  # characters of a receiver's reason phrase or an error message kept


class DeliveryFailed(Exception):
    def __init__(self, message: str, *, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent


def describe(exc: BaseException, url: str = "") -> str:
    """``exc`` as one short printable line: its type, a reason we know to hold no URL (the
    system's text for an ``OSError``'s number, OpenSSL's reason code, a known ``http.client``
    refusal) and where it went, ``scheme://host:port`` (``endpoint``). Never the exception's
    own text: ``http.client`` quotes a path it refuses escaped (``\\x01``), past any search for
    the path, and the path is often a token."""
    name = type(exc).__name__
    if isinstance(exc, TimeoutError):
        why = "timed out"
    elif isinstance(exc, ssl.SSLError):
        why = str(exc.reason or "")
    elif isinstance(exc, socket.gaierror):  # getaddrinfo's own table: "Name or service not known"
        why = exc.strerror if isinstance(exc.strerror, str) else "name look-up failed"
    elif isinstance(exc, OSError) and isinstance(exc.errno, int):
        why = os.strerror(exc.errno)
    elif isinstance(exc, OSError):  # a proxy refusing CONNECT: its status code only (the rest is its text)
        tunnel = re.match(r"Tunnel connection failed: (\d{3})\b", str(exc))
        why = f"Tunnel connection failed: {tunnel[1]}" if tunnel else ""
    else:
        why = _KNOWN.get(str(exc), "") if isinstance(exc, http.client.HTTPException) else ""
    where = endpoint(url) if url else ""
    return short(f"{name}{': ' + why if why else ''}{f' ({where})' if where else ''}")


# http.client's texts we recognise (compared, never quoted: a new wording shows the type only)
_KNOWN = {"got more than 100 headers": "more than 100 headers"}


def endpoint(url: str) -> str:
    """``scheme://host:port`` of a URL (the port 80 or 443 when none is given), made printable:
    what a message may say of it. Never its path or query, often a token."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "?", parts.port or _default_port(parts.scheme)
    except ValueError:
        return "an unreadable URL"
    return short(f"{parts.scheme}://{f'[{host}]' if ':' in host else host}:{port}")


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def post(url: str, doc: dict[str, Any], timeout: float | None = None) -> None:
    """POST one event; ``DeliveryFailed`` (permanent for a 4xx other than 408 and 429) else."""
    deadline = TIMEOUT if timeout is None else timeout
    parts = urlsplit(url)
    if "@" in parts.netloc:
        raise DeliveryFailed("the URL carries credentials (user:password@): refused, nothing sent")
    try:
        port = parts.port or _default_port(parts.scheme)  # always given: http.client reads "::1" as host ":", port 1
    except ValueError:
        raise DeliveryFailed("the URL's port is not a number") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DeliveryFailed("not an http(s) URL with a host")
    if not url.isprintable() or " " in url:  # the settings refuse it first
        raise DeliveryFailed(f"the URL to {endpoint(url)} holds a space or a control character: refused, nothing sent")
    body = json.dumps(doc, default=str).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "stream-reconciler",
               "X-Reconciler-Event": str(doc.get("type")), "X-Reconciler-Delivery": str(doc.get("id"))}
    conn, target = _connection(parts, port, deadline, headers)
    watchdog = conn.watchdog = _Watchdog(conn, deadline)
    try:
        conn.request("POST", target, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read(MAX_BODY)
        status, reason, location = resp.status, resp.reason, resp.getheader("Location")
    except Exception as exc:  # noqa: BLE001 - any exception of an attempt is a failed attempt (module doc)
        if watchdog.fired:
            raise DeliveryFailed(f"timed out: no complete answer within {deadline:g} s") from None
        raise DeliveryFailed(describe(exc, url)) from None
    finally:
        watchdog.cancel()
        conn.close()
    judge(status, reason, location)


def _connection(parts: SplitResult, port: int, deadline: float,
                headers: dict[str, str]) -> tuple[_Watched, str]:
    """The connection to make and the request target: straight to the receiver, or through the
    proxy that ``http_proxy`` / ``https_proxy`` name (``no_proxy`` honoured), as urllib did."""
    path = urlunsplit(("", "", parts.path or "/", parts.query, ""))
    kind = _HTTPSConnection if parts.scheme == "https" else _HTTPConnection
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname):
        return kind(parts.hostname, port, timeout=deadline), path
    via = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    via_port = via.port or _default_port(via.scheme)
    auth = {}
    if via.username is not None:
        token = base64.b64encode(f"{unquote(via.username)}:{unquote(via.password or '')}".encode()).decode()
        auth = {"Proxy-Authorization": f"Basic {token}"}
    if parts.scheme == "https":  # a CONNECT tunnel: TLS runs end to end with the receiver
        conn = kind(via.hostname, via_port, timeout=deadline)
        conn.set_tunnel(parts.hostname, port, headers=auth)
        return conn, path
    headers.update(auth)
    return _HTTPConnection(via.hostname, via_port, timeout=deadline), urlunsplit(
        ("http", parts.netloc, parts.path or "/", parts.query, ""))


def judge(status: int, reason: str, location: str | None = None) -> None:
    """Accept a 2xx; anything else is a ``DeliveryFailed``."""
    if 200 <= status < 300:
        return
    said = short(f"HTTP {status} {reason or ''}".rstrip())
    if 300 <= status < 400:
        raise DeliveryFailed(f"{said}: a redirect{_where(location)}, not followed (set webhook to the URL "
                             "that answers the POST itself)")
    if 400 <= status < 500 and status not in (408, 429):
        raise DeliveryFailed(said, permanent=True)
    if status < 200 or status >= 600:
        raise DeliveryFailed(f"{said}: not an answer to a POST")
    raise DeliveryFailed(said)


def _where(location: str | None) -> str:
    """Where a redirect points, by scheme, host and port only (its path may hold a token)."""
    if not location:
        return ""
    try:
        parts = urlsplit(location.strip())
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return " to an unreadable Location"
    if not parts.hostname:
        return " to another path on the same host"
    return f" to {short(f'{parts.scheme}://{parts.hostname}{port}')}"


def short(text: str) -> str:
    text = printable(text)
    return text if len(text) <= TEXT else text[:TEXT] + "..."


class _Watchdog:
    """Shuts the connection's socket down when the POST's time is up: a read blocked on a
    receiver that trickles bytes returns at once, whatever the per-read timeout."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float):
        self._conn = conn
        self._lock = threading.Lock()
        self.fired = False
        self._timer = threading.Timer(max(0.0, seconds), self.cut)
        self._timer.daemon = True
        self._timer.start()

    def cut(self) -> None:
        with self._lock:
            self.fired = True
            sock = self._conn.sock
            if sock is not None:
                try:  # the plain socket's shutdown: an SSL socket's own would drop its state under the reader
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass

    def connected(self) -> None:
        """The socket exists now: cut it at once if the time ran out while it was being made."""
        with self._lock:
            late = self.fired
        if late:
            self.cut()

    def cancel(self) -> None:
        self._timer.cancel()


class _Watched:
    watchdog: _Watchdog | None = None

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        if self.watchdog is not None:
            self.watchdog.connected()


class _HTTPConnection(_Watched, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_Watched, http.client.HTTPSConnection):
    pass
