"""The log scrubber: every secret value this process has seen, hidden in free text.

Libraries echo what they were given: librdkafka quotes (a truncated copy of) an invalid
property value in its error and logs ``CONFWARN ... set to '<value>'``; a URI parser's
error may quote ``user:password@host``. So every value ``secrets`` resolves (``${env:}``
and ``${file:}`` alike), every literal under a secret key and every literal password in
a URI is taught to the process-wide ``scrubber``; ``scrub(text)`` hides each of them, and
any fragment of one of at least ``FRAGMENT`` characters. The log handler, every error
message that is stored or served (``/healthz``, the status page, the database) and every
refusal the command line prints go through it.
"""

from __future__ import annotations

import json
import threading
from typing import Any

REDACTED = "***"
FRAGMENT = 8  # characters: a shorter piece of a secret is hidden only when it is the whole secret
_SHORTEST = 3  # a secret of one or two characters cannot be hidden without hiding every word


class Scrubber:
    """The secret values this process has seen, and their fragments, to hide in free text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._whole: set[str] = set()
        self._grams: set[str] = set()

    def learn(self, value: Any) -> None:
        text = str(value) if value is not None else ""
        if len(text) < _SHORTEST or text in self._whole:
            return
        # A library may show the value raw, repr-escaped or JSON-escaped: learn all three.
        forms = {text, repr(text)[1:-1], json.dumps(text)[1:-1]}
        grams = {f[i:i + FRAGMENT] for f in forms for i in range(len(f) - FRAGMENT + 1)}
        with self._lock:
            self._whole |= forms
            self._grams |= grams

    def scrub(self, text: str) -> str:
        if not self._whole or not text:
            return text
        with self._lock:
            whole, grams = sorted(self._whole, key=len, reverse=True), self._grams
        for value in whole:
            text = text.replace(value, REDACTED)
        if not grams or len(text) < FRAGMENT:
            return text
        hidden = bytearray(len(text))
        for i in range(len(text) - FRAGMENT + 1):
            if text[i:i + FRAGMENT] in grams:
                hidden[i:i + FRAGMENT] = b"\x01" * FRAGMENT
        if not any(hidden):
            return text
        out, i = [], 0
        while i < len(text):
            if hidden[i]:
                while i < len(text) and hidden[i]:
                    i += 1
                out.append(REDACTED)
            else:
                out.append(text[i])
                i += 1
        return "".join(out)


scrubber = Scrubber()


def scrub(text: Any) -> Any:
    """``text`` with every secret this process resolved (or any long fragment of one) hidden;
    None passes through."""
    return scrubber.scrub(str(text)) if text is not None else None
