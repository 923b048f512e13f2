"""A reconcile pass longer than the leader lease (issue 15: the first pass over ten
thousand files takes ~22 s, the lease lasts 15 s).

* ``reconcile_once`` asks ``leading`` after each file, before reading the database and
  before each action; once it says no, nothing more is applied (``fenced``);
* a daemon whose pass lasts several lease TTLs (a slow loader) keeps the lease under
  one token the whole time: a standby beside it stays standby, and every action of the
  pass is applied by the leader;
* a leader stuck in the middle of a pass stops renewing: the standby takes over within
  the TTL (as from a dead leader), and when the stuck pass resumes it applies nothing
  and its daemon steps down;
* a leader killed with SIGKILL (a ``reconciler run`` process) is replaced within the TTL.

The daemons run in this process, in threads, except the killed one; every supervisor is
suspended: no broker, no Spark.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from reconciler.control.apply import Applier
from reconciler.control.reconcile import reconcile_once
from reconciler.daemon.leadership import Leadership
from reconciler.errors import ReconcilerError
from reconciler.observe.metrics import Metrics
from reconciler.spec import loader
from reconciler.store.store import Store
from tests.daemon.test_notify import daemon_env, daemons, tail, wait_until  # noqa: F401 (fixture)
from tests.daemon.test_watch import daemon_thread, suspended
from tests.e2e import helpers

TTL = 3.0


@pytest.fixture(scope="module", autouse=True)
def _warm_daemon(tmp_path_factory):
    """The daemons here share this process: the first to lead imports what recovery and the
    loader need (the Iceberg catalog, JSON Schema: seconds on a loaded machine) between taking
    the lease and its first chance to renew it. One warm-up daemon pays that beforehand, so
    the short TTL measures the pass, not the imports."""
    s = helpers.make_settings(tmp_path_factory.mktemp("warm"))
    helpers.write_spec(s.specs, suspended("warm"))
    with daemon_thread(s) as d:
        wait_until(lambda: d.metrics.passes_count("changed") > 0, 60, "the warm-up daemon's first pass")


def _specs(settings, n: int) -> list[str]:
    ids = [f"s{i:02d}" for i in range(n)]
    for sid in ids:
        helpers.write_spec(settings.specs, suspended(sid))
    return ids


def _created_by(store: Store, ids) -> dict[str, str]:
    """Who created each supervisor (the audit log's actor)."""
    out = {}
    for sid in ids:
        for entry in store.history(sid):
            if entry["action"] == "create":
                out[sid] = entry["actor"]
    return out


def _slow_loader(monkeypatch, seconds: float, hang_at: int | None = None):
    """Each spec file takes ``seconds`` to load; with ``hang_at``, the first thread to load
    reaches that file and waits there until ``release`` is set. Returns (hung, release)."""
    real = loader.spec_result
    hung, release = threading.Event(), threading.Event()
    first: list[int] = []
    counts: dict[int, int] = {}

    def slow(*args, **kwargs):
        me = threading.get_ident()
        if not first:
            first.append(me)
        counts[me] = counts.get(me, 0) + 1
        if hang_at is not None and me == first[0] and counts[me] == hang_at and not hung.is_set():
            hung.set()
            release.wait(60)
        time.sleep(seconds)
        return real(*args, **kwargs)

    monkeypatch.setattr(loader, "spec_result", slow)
    return hung, release


# --------------------------------------------------------------------------- reconcile_once


def test_reconcile_once_applies_nothing_once_leading_says_no(tmp_path):
    s = helpers.make_settings(tmp_path)
    ids = _specs(s, 5)
    store = Store(s.db_url)
    store.migrate()
    try:
        calls: list[str] = []
        answers = iter([True] * 5 + [True] + [True, True] + [False] * 10)  # 5 files, the read, 2 actions

        def leading() -> bool:
            calls.append("x")
            return next(answers)

        result = reconcile_once(s.specs, Applier(store, actor="test"), leading=leading)
        assert result is not None and result.fenced
        assert len(result.plan.actions) == 5 and len(result.results) == 2 and all(r.ok for r in result.results)
        assert len(store.read_actual().supervisors) == 2  # the third action was never applied
        assert len(calls) == 5 + 1 + 3

        # lost before the database is read: nothing read, planned or applied
        result = reconcile_once(s.specs, Applier(store, actor="test"), leading=lambda: False)
        assert result is not None and result.fenced and not result.plan.actions and not result.results
        assert len(store.read_actual().supervisors) == 2

        result = reconcile_once(s.specs, Applier(store, actor="test"), leading=lambda: True)
        assert result is not None and not result.fenced and len(result.results) == 3
        assert sorted(store.read_actual().supervisors) == ids
    finally:
        store.close()


# --------------------------------------------------------------------------- the daemon


@pytest.mark.integration  # waits out real lease TTLs
def test_a_pass_longer_than_the_lease_keeps_leadership(tmp_path, monkeypatch):
    s = helpers.make_settings(tmp_path, lease_ttl=TTL, tick_interval=60.0)
    ids = _specs(s, 20)
    _slow_loader(monkeypatch, 0.4)  # the first pass takes ~8 s: 2.7 lease TTLs
    store = Store(s.db_url)
    store.migrate()
    try:
        with daemon_thread(s) as a:
            wait_until(lambda: a.lease_token is not None, 10, "a leader")
            started = time.monotonic()
            seen: set = set()
            done = threading.Event()

            def sample() -> None:  # the lease row, from the first pass's start to its end
                while not done.is_set():
                    lease = store.lease()
                    seen.add((lease.holder, lease.token) if lease else (None, None))
                    time.sleep(0.05)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            try:
                with daemon_thread(s) as b:  # a standby, ready to take over a lease that runs out
                    wait_until(lambda: a.metrics.passes_count("changed") > 0, 30, "the leader's first pass")
                    took = time.monotonic() - started
                    assert b.lease_token is None and b.status_line() == f"standby: leader is {a.holder}"
            finally:
                done.set()
                sampler.join(5)
            assert took > 2 * TTL, f"the pass took {took:.1f}s: not longer than the lease"
            assert seen == {(a.holder, 1)}  # one holder, one token: never lost, never taken over
            assert a.lease_token == 1 and a.metrics.passes_count("aborted") == 0
            ok, body = a.metrics.health()
            assert ok, body  # the loop was alive all along: the pass showed its progress
        assert _created_by(store, ids) == {sid: f"daemon:{a.holder}" for sid in ids}
    finally:
        store.close()


@pytest.mark.integration  # waits out real lease TTLs
def test_a_leader_stuck_mid_pass_is_replaced_within_the_ttl_and_applies_nothing(tmp_path, monkeypatch):
    s = helpers.make_settings(tmp_path, lease_ttl=TTL, tick_interval=60.0)
    ids = _specs(s, 12)
    hung, release = _slow_loader(monkeypatch, 0.15, hang_at=8)  # hangs ~1 s into its first pass
    store = Store(s.db_url)
    store.migrate()
    try:
        with daemon_thread(s) as a:
            wait_until(lambda: a.lease_token is not None, 10, "a leader")
            wait_until(hung.is_set, 10, "the leader's pass to hang")
            t_hang = time.monotonic()
            with daemon_thread(s) as b:
                wait_until(lambda: b.lease_token is not None, TTL + 10, "the standby to take over")
                took_over = time.monotonic() - t_hang
                assert took_over <= TTL + 1.5, f"the standby took {took_over:.1f}s to take over"
                assert b.lease_token == 2 and store.lease().holder == b.holder
                wait_until(lambda: len(store.read_actual().supervisors) == len(ids), 30, "the new leader's pass")
                release.set()  # the deposed leader's pass resumes: it must apply nothing
                wait_until(lambda: a.lease_token is None, 10, "the deposed leader to step down")
                assert a.status_line() == f"standby: leader is {b.holder}"
                assert a.metrics.passes_count("aborted") >= 1 and a.metrics.passes_count("changed") == 0
                assert b.lease_token == 2
        assert _created_by(store, ids) == {sid: f"daemon:{b.holder}" for sid in ids}
        assert not any(e["actor"] == f"daemon:{a.holder}" for sid in ids for e in store.history(sid))
    finally:
        release.set()
        store.close()


def test_a_deposed_leader_names_the_new_leader_from_the_moment_it_steps_down(tmp_path):
    """Status readers (systemd's STATUS, ``/healthz``, tests) run in other threads: no
    moment between "leader" and "standby: leader is <holder>" may read "leader is unknown"
    (a CI run caught the gap between the token going and the holder being looked up)."""
    s = helpers.make_settings(tmp_path, lease_ttl=TTL)
    store = Store(s.db_url)
    store.migrate()
    seen: list[tuple[int | None, str | None]] = []

    class Watched(Leadership):
        def __setattr__(self, name, value):
            super().__setattr__(name, value)
            if name in ("lease_token", "leader_seen") and "leader_seen" in self.__dict__:
                seen.append((self.lease_token, self.leader_seen))

    try:
        me = Watched(store, lambda: s, "me", Metrics(), ping=lambda: None)
        assert store.acquire_lease("me", TTL) == 1
        me.lease_token, me._renewed = 1, time.monotonic()  # leading term 1 (no runtimes: none needed)
        seen.clear()
        store.release_lease("me")
        assert store.acquire_lease("other", 60) == 2  # taken while this one was paused
        assert me.hold() is False
        assert me.lease_token is None and me.leader_seen == "other"
        assert (None, None) not in seen, f"a reader could see 'leader is unknown': {seen}"
    finally:
        store.close()


def _status(token, seen_holder) -> str:
    """``Daemon.status_line`` from a role's two fields (leader or standby)."""
    return f"standby: leader is {seen_holder or 'unknown'}" if token is None else f"leader (token {token})"


def _retaking(store, s, seen: list, fail: bool) -> Leadership:
    """A leader of term 1 whose ``_become_leader`` records what a reader sees meanwhile."""

    class Retaking(Leadership):
        def __setattr__(self, name, value):
            super().__setattr__(name, value)
            if name in ("lease_token", "leader_seen") and "leader_seen" in self.__dict__:
                seen.append((self.lease_token, self.leader_seen))

        def _become_leader(self, token):
            seen.append((self.lease_token, self.leader_seen))  # while the new term's recovery runs
            if fail:
                raise ReconcilerError("database went away during recovery")
            self.manager = None

    me = Retaking(store, lambda: s, "me", Metrics(), ping=lambda: None)
    assert store.acquire_lease("me", TTL) == 1
    me.lease_token, me._renewed = 1, time.monotonic()
    seen.clear()
    store.release_lease("me")  # ran out while this one was paused; nobody else took it
    return me


@pytest.mark.parametrize("fail", [False, True], ids=["new-term", "start-fails"])
def test_a_leader_retaking_its_own_lost_lease_never_reads_unknown(tmp_path, fail):
    """From the review: the lease ran out unseen and this daemon took it again (a new token);
    between the two terms, or after a new term that failed to start, a reader must not see
    "leader is unknown"."""
    s = helpers.make_settings(tmp_path, lease_ttl=TTL)
    store = Store(s.db_url)
    store.migrate()
    seen: list = []
    try:
        me = _retaking(store, s, seen, fail)
        assert me.hold() is (not fail)
        assert me.lease_token == (None if fail else 2)
        statuses = [_status(*x) for x in seen]
        assert "standby: leader is unknown" not in statuses, statuses
    finally:
        store.close()


def test_a_killed_leader_is_replaced_within_the_ttl(tmp_path, daemons):  # noqa: F811 (fixture)
    s = helpers.make_settings(tmp_path, lease_ttl=TTL, tick_interval=60.0)
    ids = _specs(s, 3)
    proc, log = daemons.start("leader", daemon_env(s))
    wait_until(lambda: _leader(s) is not None, 60, "the process to lead", proc=proc, log=log)
    store = Store(s.db_url)
    try:
        wait_until(lambda: len(store.read_actual().supervisors) == len(ids), 30, "its first pass", proc=proc, log=log)
        with daemon_thread(s) as b:
            wait_until(lambda: b.status_line().startswith("standby"), 10, "a standby")
            renewed = store.lease().expires_at
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            t_kill = time.monotonic()
            wait_until(lambda: b.lease_token is not None, TTL + 10, "the standby to take over")
            took_over = time.monotonic() - t_kill
            assert took_over <= TTL + 1.5, f"the standby took {took_over:.1f}s to take over\n{tail(log)}"
            lease = store.lease()
            assert lease.holder == b.holder and lease.token == 2 and lease.expires_at > renewed
    finally:
        store.close()


def _leader(settings) -> str | None:
    store = Store(settings.db_url)
    try:
        lease = store.lease()
        return lease.holder if lease else None
    except Exception:  # noqa: BLE001 (not migrated yet)
        return None
    finally:
        store.close()
