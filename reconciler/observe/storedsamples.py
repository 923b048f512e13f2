"""The charts' samples on a daemon that does not lead: the ones the leader's lag observer keeps
in the database (``store.samples``), for the status pages.

Read whole once, then only the rows written since (by id: the leader writes a round's samples
in one transaction), and pruned to the last hour here as the leader prunes the table: a page
on a follower costs one small query per rendering, not the whole hour of every supervisor (some
72,000 rows for 100 supervisors at the default ``lagInterval``). A sample the leader backdates
(a backfill's creation) is placed in time order.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable
from datetime import datetime, timedelta

from reconciler.observe.lagwatch import HISTORY, Sample
from reconciler.store.store import Store


class StoredSamples:
    """``history(ids, now)``: per supervisor, its samples of the last hour, oldest first."""

    def __init__(self, store: Store):
        self.store = store
        self._last_id = 0
        self._samples: dict[str, list[Sample]] = {}
        self._lock = threading.Lock()

    def history(self, supervisor_ids: Iterable[str], now: datetime) -> dict[str, list[Sample]]:
        since = now - timedelta(seconds=HISTORY)
        with self._lock:
            self._last_id, rows = self.store.lag_samples_after(self._last_id, since)
            for r in rows:
                kept = self._samples.setdefault(r.supervisor_id, [])
                bisect.insort(kept, Sample(r.at, r.records, r.seconds, r.ingested), key=lambda s: s.at)
            for sid in list(self._samples):
                kept = self._samples[sid]
                del kept[:bisect.bisect_left(kept, since, key=lambda s: s.at)]
                if not kept:
                    del self._samples[sid]
            return {sid: list(self._samples.get(sid, ())) for sid in supervisor_ids}
