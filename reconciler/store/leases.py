"""The leader lease (a fencing token bumped on takeover) and the daemons' heartbeats."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from reconciler.errors import PublishConflict
from reconciler.store.base import _aware, utcnow
from reconciler.store.records import DaemonBeat, Lease
from reconciler.store.tables import leases


class LeasesMixin:
    def acquire_lease(self, holder: str, ttl: float, *, name: str = "leader", now=None) -> int | None:
        """Take or renew the lease; returns our fencing token, or None while another holds it."""
        now = now or utcnow()
        expires = now + timedelta(seconds=ttl)
        try:
            with self._write() as c:
                row = c.execute(sa.select(leases).where(leases.c.name == name).with_for_update()).first()
                if row is None:
                    c.execute(sa.insert(leases).values(name=name, holder=holder, token=1, expires_at=expires))
                    return 1
                if row.holder == holder and _aware(row.expires_at) > now:
                    c.execute(sa.update(leases).where(leases.c.name == name).values(expires_at=expires))
                    return int(row.token)
                if _aware(row.expires_at) <= now:
                    token = int(row.token) + 1
                    c.execute(sa.update(leases).where(leases.c.name == name).values(holder=holder, token=token, expires_at=expires))
                    return token
                return None
        except sa_exc.IntegrityError:
            return None  # another daemon inserted the first lease at the same moment

    def release_lease(self, holder: str, *, name: str = "leader") -> None:
        with self._write() as c:
            c.execute(sa.update(leases).where(leases.c.name == name, leases.c.holder == holder).values(expires_at=utcnow()))

    def lease(self, *, name: str = "leader") -> Lease | None:
        with self._read() as c:
            row = c.execute(sa.select(leases).where(leases.c.name == name)).first()
        return Lease(row.name, row.holder, int(row.token), _aware(row.expires_at)) if row else None

    # Daemon heartbeats share the leases table: name "daemon:<holder>", the holder
    # column holds the daemon's role ("leader" or "standby"), token is unused (0).

    def heartbeat(self, holder: str, role: str, ttl: float, *, now=None) -> None:
        """Record that daemon ``holder`` is alive as ``role`` until now + ttl (for ``reconciler status``)."""
        now = now or utcnow()
        name = f"daemon:{holder}"[:128]
        with self._write() as c:
            hit = c.execute(sa.update(leases).where(leases.c.name == name)
                            .values(holder=role, expires_at=now + timedelta(seconds=ttl))).rowcount
            if not hit:
                c.execute(sa.insert(leases).values(name=name, holder=role, token=0,
                                                   expires_at=now + timedelta(seconds=ttl)))
            # heartbeats of daemons gone for a day (SIGKILL, power cut) are forgotten
            c.execute(sa.delete(leases).where(leases.c.name.like("daemon:%"),
                                              leases.c.expires_at < now - timedelta(days=1)))

    def forget_daemon(self, holder: str) -> None:
        with self._write() as c:
            c.execute(sa.delete(leases).where(leases.c.name == f"daemon:{holder}"[:128]))

    def daemons(self, *, now=None) -> list[DaemonBeat]:
        """Live daemons (heartbeat not expired), leader first."""
        now = now or utcnow()
        with self._read() as c:
            rows = c.execute(sa.select(leases).where(leases.c.name.like("daemon:%"))).mappings().all()
        live = [DaemonBeat(r["name"][len("daemon:"):], r["holder"], _aware(r["expires_at"]))
                for r in rows if _aware(r["expires_at"]) > now]
        return sorted(live, key=lambda d: (d.role != "leader", d.daemon))

    @staticmethod
    def _check_lease(c, holder: str, token: int) -> None:
        row = c.execute(sa.select(leases).where(leases.c.name == "leader").with_for_update(read=True)).first()
        if row is None or row.holder != holder or int(row.token) != token or _aware(row.expires_at) <= utcnow():
            raise PublishConflict(f"leader lease lost by {holder} (token {token}); publish fenced")
