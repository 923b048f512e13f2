"""Control-plane cost at 1,000 and 10,000 supervisors: validate, plan, the daemon's no-op pass,
reaction to one changed file and to a dropped marker, ``status --no-lag``, memory.

Prints ONE JSON document on stdout (progress on stderr). No broker and no Spark: every
spec is a small suspended Kafka supervisor (suspended supervisors touch no broker), the
database is a SQLite file in a temporary state directory. For each N in ``--specs``:

* ``validate``: ``load_directory`` without a cache (every file read, parsed, validated),
  in this process, and ``reconciler validate`` as a subprocess (wall time, max RSS);
* ``plan``: ``reconciler plan -o json --no-positions`` as a subprocess against N created
  supervisors, and the same against ``--baseline`` specs; ``marginal_ms_per_spec`` is
  (t(N) - t(baseline)) / (N - baseline), so interpreter start-up and imports are not
  counted per spec; ``in_process`` splits one plan into load, database read and plan;
* ``noop_pass``: the daemon (``Daemon.run`` in a thread, no HTTP, a 0.05 s tick) over N
  unchanged files; the figures are the daemon's own ``reconciler_tick_duration_seconds``
  observations of its unchanged passes (median, p95, max), plus the SQL statements of one
  pass (``reconcile_once`` with a warm cache) and the cache's hits; ``lease`` says whether
  the first (cold) pass outlasted the lease TTL and whether the daemon kept its lease
  through it (it renews the lease during a pass);
* ``change_latency``: with that daemon (default debounce 0.3 s, the tick at 30 s so only
  the file watcher triggers), one spec file is rewritten (a new ``taskDuration``) and the
  time until the database holds its new spec hash is measured, ``--repetitions`` times;
* ``marker_latency``: the same for a dropped ``<id>.reset.yaml`` (``resetTo: latest``,
  ``backfill: false``) until the request is recorded in the database and until the file is
  renamed ``.applied``. Positions come from a stub instead of a broker (``positions.adapter_for``):
  what is measured is the control plane, not a broker's answer time;
* ``status_no_lag``: ``reconciler status --no-lag -o json`` as a subprocess (seven runs, wall
  time from exec to exit: interpreter start-up and imports included), and
  ``all_status(with_latest=False)`` in process;
* ``memory``: max RSS of each subprocess above (through GNU ``time``: a forked child's
  peak would start at this process's size), and this process's RSS before the specs were
  loaded and after the daemon's passes (the daemon's cache and state included).

Usage: ``.venv/bin/python benchmarks/control_plane.py [--specs 1000 10000] [--repetitions 20]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from reconciler import settings as settings_mod  # noqa: E402
from reconciler.control import positions  # noqa: E402
from reconciler.control.apply import Applier  # noqa: E402
from reconciler.control.plan import desired_from_directory, plan  # noqa: E402
from reconciler.control.reconcile import reconcile_once  # noqa: E402
from reconciler.daemon import Daemon  # noqa: E402
from reconciler.observe.status import all_status  # noqa: E402
from reconciler.spec.loader import SpecCache, load_directory  # noqa: E402
from reconciler.store.store import Store  # noqa: E402

log = logging.getLogger("bench")
CLI = [str(Path(sys.executable).parent / "reconciler")]


def spec_text(i: int, task_duration: str = "30s") -> str:
    return f"""\
id: s{i:05d}
suspended: true
source:
  type: kafka
  bootstrapServers: 127.0.0.1:9092
  topic: topic-{i}
taskDuration: {task_duration}
dataSchema:
  datasource: ds_{i}
  timestamp: {{column: ts, format: millis}}
  dimensions: [user, page, __partition, __offset]
  granularity: {{segment: hour, query: none, rollup: false}}
"""


# --------------------------------------------------------------------------- set-up


class Tree:
    """A spec directory, a state directory and a SQLite database for N supervisors."""

    def __init__(self, base: Path, n: int):
        self.n = n
        self.specs = base / f"specs-{n}"
        self.state = base / f"state-{n}"
        for d in (self.specs, self.state):
            d.mkdir(parents=True)
            d.chmod(0o755)
        for i in range(n):
            (self.specs / f"s{i:05d}.yaml").write_text(spec_text(i))
        self.db = f"sqlite:///{self.state / 'reconciler.db'}"
        self.store = Store(self.db)
        self.store.migrate()

    def create_all(self) -> float:
        started = time.perf_counter()
        result = reconcile_once(str(self.specs), Applier(self.store, actor="bench"))
        assert result is not None and all(r.ok for r in result.results), "set-up pass failed"
        assert len(self.store.read_actual().supervisors) == self.n
        return time.perf_counter() - started

    def cli(self, *args: str) -> dict[str, Any]:
        """Run ``reconciler`` with this tree's settings: wall seconds, exit code, max RSS."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILER_") and k != "STATE_DIRECTORY"}
        env |= {"RECONCILER_SPECS": str(self.specs), "RECONCILER_DB": self.db, "RECONCILER_STATE_DIR": str(self.state)}
        # A forked child's max RSS starts at its parent's (this process, holding N specs):
        # GNU time, small itself, reports the command's own peak.
        with tempfile.NamedTemporaryFile("r") as rss:
            wrap = ["/usr/bin/time", "-f", "%M", "-o", rss.name] if os.path.exists("/usr/bin/time") else []
            started = time.perf_counter()
            proc = subprocess.run([*wrap, *CLI, *args], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, check=False)
            seconds = time.perf_counter() - started
            kib = rss.read().strip().splitlines()[-1:] if wrap else []
        if proc.returncode not in (0, 2):
            log.warning("reconciler %s: exit %s: %s", " ".join(args), proc.returncode,
                        proc.stderr.decode(errors="replace")[-500:])
        peak = _mib(int(kib[0]) * 1024) if kib and kib[0].isdigit() else None
        return {"seconds": round(seconds, 3), "exit": proc.returncode, "max_rss_mib": peak}


def _mib(n: float) -> float:
    return round(n / (1 << 20), 1)


def rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return _mib(int(line.split()[1]) * 1024)
    return float("nan")


def summary(samples: list[float], digits: int = 4) -> dict[str, Any]:
    s = sorted(samples)
    p95 = s[min(len(s) - 1, max(0, round(0.95 * len(s)) - 1))]
    return {"n": len(s), "median": round(statistics.median(s), digits), "p95": round(p95, digits),
            "max": round(s[-1], digits), "min": round(s[0], digits)}


# --------------------------------------------------------------------------- measures


def measure_validate(tree: Tree) -> dict[str, Any]:
    started = time.perf_counter()
    state = load_directory(str(tree.specs))
    seconds = time.perf_counter() - started
    assert len(state.specs) == tree.n and not state.problems
    cli = tree.cli("validate")
    return {"in_process_seconds": round(seconds, 3), "ms_per_spec": round(seconds / tree.n * 1000, 3),
            "cli": cli}


def measure_plan(tree: Tree, baseline: Tree) -> dict[str, Any]:
    runs = [tree.cli("plan", "-o", "json", "--no-positions") for _ in range(3)]
    base = [baseline.cli("plan", "-o", "json", "--no-positions") for _ in range(3)]
    t_n = statistics.median(r["seconds"] for r in runs)
    t_0 = statistics.median(r["seconds"] for r in base)
    t0 = time.perf_counter()
    state = load_directory(str(tree.specs))
    t1 = time.perf_counter()
    actual = tree.store.read_actual()
    t2 = time.perf_counter()
    p = plan(desired_from_directory(state), actual)
    t3 = time.perf_counter()
    assert not p.actions, "nothing should be planned against the created supervisors"
    return {
        "cli_seconds": round(t_n, 3), "baseline_specs": baseline.n, "baseline_cli_seconds": round(t_0, 3),
        "marginal_ms_per_spec": round((t_n - t_0) / (tree.n - baseline.n) * 1000, 3),
        "max_rss_mib": max(r["max_rss_mib"] for r in runs),
        "in_process": {"load_seconds": round(t1 - t0, 3), "read_actual_seconds": round(t2 - t1, 4),
                       "plan_seconds": round(t3 - t2, 4)},
    }


def measure_one_pass(tree: Tree) -> dict[str, Any]:
    """One ``reconcile_once`` with a warm cache: its SQL statements and the cache's counters."""
    cache = SpecCache()
    reconcile_once(str(tree.specs), Applier(tree.store, actor="bench"), cache=cache)
    statements: list[str] = []

    def count(_conn, _cursor, statement, *_args):
        statements.append(statement.split()[0].upper())

    sa.event.listen(tree.store.engine, "before_cursor_execute", count)
    try:
        started = time.perf_counter()
        result = reconcile_once(str(tree.specs), Applier(tree.store, actor="bench"), cache=cache)
        seconds = time.perf_counter() - started
    finally:
        sa.event.remove(tree.store.engine, "before_cursor_execute", count)
    assert result is not None and not result.results
    return {"seconds": round(seconds, 4), "sql_statements": len(statements),
            "sql_kinds": sorted(set(statements)), "cache": vars(cache.stats)}


class DaemonUnderTest:
    """The real daemon in a thread, recording the duration of each of its passes."""

    def __init__(self, tree: Tree, tick: float):
        settings = settings_mod.load(
            {"specs": str(tree.specs), "state_dir": str(tree.state), "db": tree.db, "http": "",
             "tick_interval": tick, "segments": str(tree.state / "segments")}, env={})
        self.daemon = Daemon(settings)
        self.passes: list[tuple[str, float]] = []
        done = self.daemon.metrics.reconcile_done

        def record(outcome: str, seconds: float, error: str | None = None) -> None:
            self.passes.append((outcome, seconds))
            done(outcome, seconds, error)

        self.daemon.metrics.reconcile_done = record  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.daemon.run, name="daemon", daemon=True)

    def __enter__(self) -> DaemonUnderTest:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.daemon.request_stop()
        self.thread.join(timeout=60)

    def wait_passes(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.passes) < count:
            assert self.thread.is_alive(), "the daemon stopped"
            assert time.monotonic() < deadline, f"only {len(self.passes)} passes in {timeout}s"
            time.sleep(0.01)


def measure_noop(tree: Tree, passes: int) -> dict[str, Any]:
    with DaemonUnderTest(tree, tick=0.05) as d:
        d.wait_passes(passes + 2, timeout=120 + passes * 5)
        rss = rss_mib()
        token = d.daemon.lease_token
    unchanged = [s for outcome, s in d.passes[2:] if outcome == "unchanged"]
    ttl = d.daemon.settings.lease_ttl
    return {"daemon_tick_seconds": summary(unchanged), "first_pass_seconds": round(d.passes[0][1], 3),
            # a first pass longer than the lease renews it on the way: same token, nothing aborted
            "lease": {"ttl_seconds": ttl, "first_pass_longer_than_ttl": d.passes[0][1] > ttl,
                      "kept": token is not None and not any(o == "aborted" for o, _ in d.passes)},
            "rss_mib_after": rss, "one_pass": measure_one_pass(tree)}


def _wait_for(condition, timeout: float = 30.0, poll: float = 0.005) -> float:
    started = time.perf_counter()
    while not condition():
        if time.perf_counter() - started > timeout:
            raise TimeoutError("condition not met")
        time.sleep(poll)
    return time.perf_counter() - started


class _NoBroker:
    """A stream adapter without a broker: two partitions, offsets 0 to 100."""

    def earliest(self) -> dict[str, int]:
        return {"0": 0, "1": 0}

    def latest(self) -> dict[str, int]:
        return {"0": 100, "1": 100}

    def close(self) -> None:
        pass


def measure_reactions(tree: Tree, repetitions: int) -> dict[str, Any]:
    positions.adapter_for = lambda source, **kw: _NoBroker()  # the reset's positions, without a broker
    change, marker_db, marker_file = [], [], []
    with DaemonUnderTest(tree, tick=30.0) as d:
        d.wait_passes(1, timeout=300)
        time.sleep(0.5)
        for rep in range(repetitions):
            i = (rep * 7919) % tree.n
            sid, path = f"s{i:05d}", tree.specs / f"s{i:05d}.yaml"
            before = tree.store.get(sid).spec_hash
            started = time.perf_counter()
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(spec_text(i, task_duration=f"{31 + rep}s"))
            os.replace(tmp, path)  # as an editor or git writes it
            _wait_for(lambda sid=sid, before=before: tree.store.get(sid).spec_hash != before)
            change.append(time.perf_counter() - started)

            marker = tree.specs / f"{sid}.reset.yaml"
            handled = _handled_count(tree, sid)
            started = time.perf_counter()
            marker.write_text(f"resetTo: latest\nbackfill: false\nreason: bench {rep}\n")
            _wait_for(lambda sid=sid, handled=handled: _handled_count(tree, sid) > handled)
            marker_db.append(time.perf_counter() - started)
            _wait_for(lambda marker=marker: not marker.exists())
            marker_file.append(time.perf_counter() - started)
            assert (tree.specs / f"{sid}.reset.yaml.applied").exists()
            for old in tree.specs.glob(f"{sid}.reset.yaml*applied"):
                old.unlink()
            time.sleep(0.4)  # let the next change stand alone (debounce)
    return {"change_one_file_seconds": summary(change, 3),
            "marker_recorded_seconds": summary(marker_db, 3),
            "marker_renamed_seconds": summary(marker_file, 3)}


def _handled_count(tree: Tree, sid: str) -> int:
    return sum(1 for e in tree.store.history(sid) if e["action"] in ("reset", "reset-and-backfill"))


def measure_status(tree: Tree) -> dict[str, Any]:
    runs = [tree.cli("status", "--no-lag", "-o", "json") for _ in range(7)]  # exec to exit, wall time
    started = time.perf_counter()
    items = all_status(tree.store, with_latest=False)
    seconds = time.perf_counter() - started
    assert len(items) == tree.n
    return {"cli_seconds": summary([r["seconds"] for r in runs], 3), "in_process_seconds": round(seconds, 3),
            "max_rss_mib": max(r["max_rss_mib"] for r in runs)}


# --------------------------------------------------------------------------- main


def run(n: int, base: Path, baseline: Tree, repetitions: int) -> dict[str, Any]:
    log.info("N=%d: writing specs", n)
    rss_before = rss_mib()
    tree = Tree(base, n)
    out: dict[str, Any] = {"specs": n}
    log.info("N=%d: validate", n)
    out["validate"] = measure_validate(tree)
    log.info("N=%d: creating the supervisors", n)
    out["setup_create_seconds"] = round(tree.create_all(), 2)
    log.info("N=%d: plan", n)
    out["plan"] = measure_plan(tree, baseline)
    log.info("N=%d: the daemon's no-op passes", n)
    out["noop_pass"] = measure_noop(tree, passes=20)
    log.info("N=%d: reactions to a changed file and a marker", n)
    out["reaction"] = measure_reactions(tree, repetitions)
    log.info("N=%d: status --no-lag", n)
    out["status_no_lag"] = measure_status(tree)
    out["memory"] = {"process_rss_mib_before": rss_before, "daemon_process_rss_mib": out["noop_pass"]["rss_mib_after"],
                     "process_rss_mib_after": rss_mib(),
                     "process_max_rss_mib": _mib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
                     "plan_cli_max_rss_mib": out["plan"]["max_rss_mib"],
                     "status_cli_max_rss_mib": out["status_no_lag"]["max_rss_mib"],
                     "validate_cli_max_rss_mib": out["validate"]["cli"]["max_rss_mib"]}
    tree.store.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--baseline", type=int, default=10, help="specs of the plan baseline")
    parser.add_argument("--repetitions", type=int, default=20)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directories")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    log.setLevel(logging.INFO)
    base = Path(tempfile.mkdtemp(prefix="control-plane-"))
    base.chmod(0o755)
    doc: dict[str, Any] = {"benchmark": "control_plane", "python": sys.version.split()[0],
                           "cpus": os.cpu_count(), "loadavg_start": os.getloadavg()}
    try:
        import yaml

        doc["libyaml"] = bool(getattr(yaml, "__with_libyaml__", False))
        baseline = Tree(base, args.baseline)
        baseline.create_all()
        doc["runs"] = [run(n, base, baseline, args.repetitions) for n in args.specs]
        baseline.store.close()
    finally:
        doc["loadavg_end"] = os.getloadavg()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            log.info("kept %s", base)
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
