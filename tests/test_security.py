"""Security: who may write specs, secrets, shells, and where the HTTP endpoint listens.

* A spec directory, spec or marker writable by others (``o+w``, or ``g+w`` for a group
  that is not the daemon's) is refused with a warning naming the path and the mode; the
  ``allowInsecureSpecs`` setting accepts it. An insecure directory is unreadable for the
  tick: nothing destructive is planned, no reset applied.
* Secrets are only written as ``${env:}``/``${file:}`` references and appear nowhere:
  planted secrets (a RabbitMQ user's password in a ``${file:}``, a Kafka ``client.id``
  in an ``${env:}``, a wrong password of a failing supervisor) are grepped for in the
  daemon's DEBUG log (a real ``reconciler run`` process, JVM output included), the
  ``/metrics`` and ``/healthz`` bodies, ``status``/``history``/``segments``/``plan``
  output, every row of every table and every file the product wrote.
* No shell (or any process) is ever started with file content: a static scan of the
  package, and an audit hook watching process creation while hostile files are loaded.
* The HTTP endpoint binds to loopback by default.
"""

from __future__ import annotations

import ast
import collections
import json
import logging
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import devservices
from reconciler import settings as settings_mod
from reconciler.cli import cli
from reconciler.control.actual import State
from reconciler.control.apply import Applier
from reconciler.control.plan import ActionKind
from reconciler.control.reconcile import reconcile_once
from reconciler.errors import PermanentError
from reconciler.observe.metrics import Metrics, serve
from reconciler.spec import grants
from reconciler.spec import secrets as spec_secrets
from reconciler.spec.loader import load_directory
from reconciler.store.store import Store
from reconciler.store.tables import metadata

PACKAGE = Path(__file__).resolve().parent.parent / "reconciler"
CLEAN_ENV: dict[str, str | None] = {env: None for _, env, _, _ in settings_mod.describe()}
CLEAN_ENV |= {"RECONCILER_CONFIG": None, "STATE_DIRECTORY": None}


def spec_text(sid: str, *, topic: str | None = None, bootstrap: str = "127.0.0.1:9092",
              extra: str = "") -> str:
    return f"""\
id: {sid}
source:
  type: kafka
  bootstrapServers: {bootstrap}
  topic: {topic or sid}
taskDuration: 500ms
dataSchema:
  datasource: {sid.replace("-", "_")}
  timestamp: {{column: ts, format: millis}}
  dimensions: [id, user, page, __key, __partition, __offset]
{extra}"""


@pytest.fixture
def specs(tmp_path) -> Path:
    d = tmp_path / "specs"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    return d


def foreign_gid() -> int:
    return next(g for g in range(4242, 5000) if g != os.getegid() and g not in os.getgroups())


def give_to_another_group(path: Path) -> None:
    try:
        os.chown(path, -1, foreign_gid(), follow_symlinks=False)
    except PermissionError:
        pytest.skip("giving a file to another group needs root (tests run as root in CI)")


# --------------------------------------------------------------------------- permissions


@pytest.mark.parametrize(
    ("mode", "foreign_group", "refused"),
    [
        pytest.param(0o755, False, None, id="0755"),
        pytest.param(0o700, False, None, id="0700"),
        pytest.param(0o775, False, None, id="0775-our-group"),
        pytest.param(0o775, True, "writable by group", id="0775-foreign-group"),
        pytest.param(0o757, False, "writable by others (mode 0757)", id="0757"),
        pytest.param(0o777, False, "writable by others (mode 0777)", id="0777"),
        pytest.param(0o1777, False, "writable by others (mode 1777)", id="1777-sticky"),
    ],
)
def test_spec_directory_writable_by_others_is_refused(specs, mode, foreign_group, refused):
    (specs / "clicks.yaml").write_text(spec_text("clicks"))
    if foreign_group:
        give_to_another_group(specs)
    specs.chmod(mode)
    state = load_directory(str(specs))
    if refused is None:
        assert state.ok and set(state.by_id()) == {"clicks"}
        return
    assert not state.ok
    assert state.error.startswith(f"spec directory {specs} is {refused}")
    assert f"fix with chmod {'o' if 'others' in refused else 'g'}-w {specs}" in state.error
    assert state.error.endswith("or set allowInsecureSpecs")
    assert not state.specs and not state.markers, "nothing is read from a refused directory"
    allowed = load_directory(str(specs), check_permissions=False)
    assert allowed.ok and set(allowed.by_id()) == {"clicks"}


@pytest.mark.parametrize(
    ("mode", "foreign_group", "refused"),
    [
        pytest.param(0o644, False, None, id="0644"),
        pytest.param(0o600, False, None, id="0600"),
        pytest.param(0o664, False, None, id="0664-our-group"),
        pytest.param(0o664, True, "is writable by group", id="0664-foreign-group"),
        pytest.param(0o620, True, "is writable by group", id="0620-foreign-group"),
        pytest.param(0o646, False, "is writable by others (mode 0646)", id="0646"),
        pytest.param(0o666, False, "is writable by others (mode 0666)", id="0666"),
    ],
)
def test_spec_and_marker_files_writable_by_others_are_refused(specs, mode, foreign_group, refused):
    spec, marker = specs / "clicks.yaml", specs / "clicks.reset.yaml"
    spec.write_text(spec_text("clicks"))
    marker.write_text("resetTo: latest\n")
    for path in (spec, marker):
        if foreign_group:
            give_to_another_group(path)
        path.chmod(mode)
    state = load_directory(str(specs))
    assert state.ok
    if refused is None:
        assert set(state.by_id()) == {"clicks"} and [m.path for m in state.markers] == [str(marker)]
        return
    [spec_problem] = state.invalid[str(spec)].problems
    assert spec_problem.message.startswith(f"{spec} {refused}")
    assert spec_problem.message.endswith(f"refused; fix with chmod {'o' if 'others' in refused else 'g'}-w "
                                         f"{spec}, or set allowInsecureSpecs")
    assert state.invalid_ids == {"clicks": str(spec)}, "an insecure file is invalid, never absent"
    assert not state.markers and str(marker) in state.rejected_markers
    assert refused in str(state.rejected_markers[str(marker)])
    allowed = load_directory(str(specs), check_permissions=False)
    assert set(allowed.by_id()) == {"clicks"} and len(allowed.markers) == 1


def test_symlinked_spec_is_judged_by_its_target(specs):
    (specs / "real").mkdir()
    target = specs / "real" / "clicks.yaml"
    target.write_text(spec_text("clicks"))
    (specs / "clicks.yaml").symlink_to(target)
    assert set(load_directory(str(specs)).by_id()) == {"clicks"}
    target.chmod(0o666)
    state = load_directory(str(specs))
    assert "is writable by others (mode 0666)" in str(state.invalid[str(specs / "clicks.yaml")])


def test_insecure_directory_plans_nothing_destructive_and_no_reset(specs, tmp_path, caplog):
    """The tick treats a refused directory as unreadable: no termination, no reset, a warning."""
    for sid in ("a", "b", "c"):
        (specs / f"{sid}.yaml").write_text(spec_text(sid))
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    applier = Applier(store, actor="test")
    try:
        first = reconcile_once(str(specs), applier)
        assert sorted(a.supervisor_id for a in first.plan.actions) == ["a", "b", "c"]

        (specs / "b.yaml").unlink()  # one removal: the guard alone would allow it
        (specs / "a.reset.yaml").write_text("resetTo: latest\n")
        specs.chmod(0o777)
        caplog.set_level(logging.WARNING, logger="reconciler.control.reconcile")
        held = reconcile_once(str(specs), applier)
        assert held.plan.actions == ()
        assert held.plan.held_terminations == ("a", "b", "c")
        warned = [r.getMessage() for r in caplog.records if r.name == "reconciler.control.reconcile"]
        assert warned == [f"spec directory {specs} is writable by others (mode 0777): refused; "
                          f"fix with chmod o-w {specs}, or set allowInsecureSpecs"]
        assert (specs / "a.reset.yaml").exists(), "a marker in a refused directory is not consumed"
        assert not store.read_actual().handled_tokens
        assert {sid: r.state for sid, r in store.read_actual().supervisors.items()} == {
            "a": State.PENDING, "b": State.PENDING, "c": State.PENDING}

        # the same pass with allowInsecureSpecs: the directory is read as it is
        (specs / "a.reset.yaml").unlink()
        allowed = reconcile_once(str(specs), applier, check_permissions=False)
        assert [(a.kind, a.supervisor_id) for a in allowed.plan.actions] == [(ActionKind.TERMINATE, "b")]

        specs.chmod(0o755)
        (specs / "b.yaml").write_text(spec_text("b"))
        (specs / "c.yaml").chmod(0o666)
        fixed = reconcile_once(str(specs), applier)
        kinds = sorted((str(a.kind), a.supervisor_id) for a in fixed.plan.actions)
        assert kinds == [("create", "b"), ("mark-invalid", "c")]
        assert "c.yaml is writable by others (mode 0666)" in store.get("c").last_error
        assert store.get("c").state == State.PENDING, "an insecure file keeps its supervisor"
    finally:
        store.close()


def test_allow_insecure_specs_setting(specs, monkeypatch, tmp_path):
    monkeypatch.setattr(settings_mod, "DEFAULT_CONFIG", tmp_path / "none.yaml")
    assert settings_mod.Settings().allow_insecure_specs is False
    for value, expected in [("1", True), ("true", True), ("yes", True), ("0", False), ("false", False)]:
        got = settings_mod.load({}, None, env={"RECONCILER_ALLOW_INSECURE_SPECS": value})
        assert got.allow_insecure_specs is expected, value
    config = tmp_path / "config.yaml"
    config.write_text("allowInsecureSpecs: true\n")
    assert settings_mod.load({}, str(config), env={}).allow_insecure_specs is True
    with pytest.raises(PermanentError, match="allow_insecure_specs: 'maybe' is not true or false"):
        settings_mod.load({}, None, env={"RECONCILER_ALLOW_INSECURE_SPECS": "maybe"})

    (specs / "clicks.yaml").write_text(spec_text("clicks"))
    specs.chmod(0o777)
    monkeypatch.chdir(specs.parent)
    runner = CliRunner()
    refused = runner.invoke(cli, ["--specs", "specs", "validate"], env=CLEAN_ENV)
    assert refused.exit_code == 1
    assert "writable by others (mode 0777)" in refused.stdout and "allowInsecureSpecs" in refused.stdout
    ok = runner.invoke(cli, ["--specs", "specs", "--allow-insecure-specs", "true", "validate"], env=CLEAN_ENV)
    assert ok.exit_code == 0, ok.output
    ok = runner.invoke(cli, ["--specs", "specs", "validate"],
                       env=CLEAN_ENV | {"RECONCILER_ALLOW_INSECURE_SPECS": "1"})
    assert ok.exit_code == 0, ok.output
    plan = runner.invoke(cli, ["--specs", "specs", "--state-dir", "state", "plan", "-o", "json",
                               "--no-positions"], env=CLEAN_ENV)
    doc = json.loads(plan.stdout)  # nothing planned; the refusal is an error of the plan, not "no changes"
    assert plan.exit_code == 1 and doc["actions"] == []
    assert any("writable by others" in e for e in doc["errors"])


def test_literal_secrets_are_flagged_references_are_not(specs):
    (specs / "literal.yaml").write_text(spec_text("literal").replace(
        "  topic:", "  consumerProperties: {sasl.password: hunter2, client.id: app}\n  topic:"))
    (specs / "orders.yaml").write_text("""\
id: orders
source: {type: rabbitmq, uri: "rabbitmq-stream://app:s3cret@127.0.0.1:5552/%2f", streams: [o]}
dataSchema: {datasource: orders, timestamp: {column: ts}}
""")
    (specs / "referenced.yaml").write_text("""\
id: referenced
source:
  type: rabbitmq
  uri: "rabbitmq-stream://app:${file:/run/credentials/rmq}@127.0.0.1:5552/%2f"
  streams: [o]
dataSchema: {datasource: referenced, timestamp: {column: ts}}
""")
    (specs / "kafka-ref.yaml").write_text(spec_text("kafka-ref").replace(
        "  topic:", "  consumerProperties: {sasl.password: '${env:KAFKA_PASSWORD}'}\n  topic:"))
    state = load_directory(str(specs))
    assert set(state.by_id()) == {"literal", "orders", "referenced", "kafka-ref"}, "a warning, not an error"
    flagged = {(os.path.basename(w.path), w.field) for w in state.warnings if "literal secret" in w.message}
    assert flagged == {("literal.yaml", 'source.consumerProperties["sasl.password"]'),
                       ("orders.yaml", "source.uri")}
    assert all("write it as ${env:NAME} or ${file:/path}" in w.message for w in state.warnings
               if "literal secret" in w.message)
    assert all("hunter2" not in str(w) and "s3cret" not in str(w) for w in state.warnings)


# --------------------------------------------------------------------------- no shell, ever


_PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                   "os.fork", "os.forkpty", "pty.spawn")
_watch: list[list[tuple]] = []  # the audit hook records while a list is pushed here


def _audit(event: str, args: tuple) -> None:
    if _watch and event.startswith(_PROCESS_EVENTS):
        _watch[-1].append((event, args))


_hook_installed = False


def watching_processes():
    """A context manager listing every process the code in it starts (audit hooks stay forever,
    so one hook is installed once and records only inside the block)."""
    import contextlib

    global _hook_installed
    if not _hook_installed:
        sys.addaudithook(_audit)
        _hook_installed = True

    @contextlib.contextmanager
    def block():
        seen: list[tuple] = []
        _watch.append(seen)
        try:
            yield seen
        finally:
            _watch.pop()

    return block()


def test_the_package_never_starts_a_process_or_evaluates_text():
    """Static scan: no subprocess/os.system/exec/eval, no unsafe YAML loader, outside the
    test-service launcher (devservices)."""
    banned_modules = {"subprocess", "pty", "pickle", "marshal", "shelve", "commands"}
    banned_builtins = {"eval", "exec", "compile", "__import__"}
    banned_os = {"system", "popen", "execv", "execve", "execvp", "execvpe", "execl", "execle",
                 "execlp", "execlpe", "spawnv", "spawnve", "spawnl", "spawnle", "posix_spawn",
                 "posix_spawnp", "startfile", "fork", "forkpty"}
    allowed: set[tuple[str, str]] = set()
    banned_yaml = {"load", "unsafe_load", "full_load", "load_all", "unsafe_load_all", "full_load_all"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "devservices.py" or "migrations" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                found += [f"{where} import {a.name}" for a in node.names
                          if a.name.split(".")[0] in banned_modules]
            elif isinstance(node, ast.ImportFrom):
                module = (node.module or "").split(".")[0]
                names = {a.name for a in node.names}
                if module in banned_modules or (module == "os" and names & banned_os) \
                        or (module == "yaml" and names & banned_yaml):
                    found.append(f"{where} from {node.module} import {sorted(names)}")
            elif isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name) and func.id in banned_builtins \
                        and (path.name, func.id) not in allowed:
                    found.append(f"{where} {func.id}()")
                if isinstance(func, ast.Attribute):
                    owner = getattr(func.value, "id", "")
                    if (owner == "os" and func.attr in banned_os) or (owner == "yaml" and func.attr in banned_yaml):
                        found.append(f"{where} {owner}.{func.attr}()")
                for kw in node.keywords:
                    if kw.arg == "shell":
                        found.append(f"{where} shell=")
    assert found == []


HOSTILE = {
    "tag.yaml": 'id: tag\nreason: !!python/object/apply:os.system ["touch {canary}"]\n',
    "new.yaml": "id: new\nx: !!python/object/new:subprocess.Popen [[touch, {canary}]]\n",
    "name.yaml": "id: name\nx: !!python/name:os.system\n",
    "module.yaml": "id: module\nx: !!python/module:os\n",
    "subst.yaml": spec_text("subst", topic="t", extra="taskDuration2: $(touch {canary})\n"),
    "backtick.yaml": spec_text("backtick", topic="`touch {canary}`"),
    "subst.reset.yaml": "resetTo: latest\nreason: \"$(touch {canary}); `touch {canary}`\"\n",
}


def test_hostile_files_start_no_process(specs, tmp_path, monkeypatch):
    canary = tmp_path / "canary"
    for name, text in HOSTILE.items():
        (specs / name).write_text(text.replace("{canary}", str(canary)))
    monkeypatch.chdir(tmp_path)
    with watching_processes() as probe:  # the hook sees a process start when there is one
        subprocess.run(["true"], check=True)
    assert "subprocess.Popen" in [event for event, _ in probe]
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    try:
        with watching_processes() as started:
            state = load_directory(str(specs))
            result = CliRunner().invoke(cli, ["--specs", "specs", "validate"], env=CLEAN_ENV)
            reconcile_once(str(specs), Applier(store, actor="test"))
            for ref in (f"${{env:$(touch {canary})}}", f"${{file:$(touch {canary})}}"):
                with pytest.raises(PermanentError):
                    spec_secrets.resolve(ref)
            monkeypatch.setenv("RECONCILER_TEST_HOSTILE", f"$(touch {canary})")
            monkeypatch.setattr(grants, "_granted", grants.Grants.of(None, ["RECONCILER_TEST_HOSTILE"]))
            assert spec_secrets.resolve("${env:RECONCILER_TEST_HOSTILE}") == f"$(touch {canary})"
    finally:
        store.close()
    assert started == [], f"processes started while loading hostile files: {started}"
    assert not canary.exists()
    assert result.exit_code == 1
    for name in ("tag.yaml", "new.yaml", "name.yaml", "module.yaml"):
        assert "is not allowed (safe YAML only)" in str(state.invalid[str(specs / name)]), name
    assert "subst" not in state.by_id() and "backtick" not in state.by_id()


# --------------------------------------------------------------------------- HTTP


def test_http_endpoint_binds_to_loopback_by_default(tmp_path, monkeypatch):
    monkeypatch.setattr(settings_mod, "DEFAULT_CONFIG", tmp_path / "none.yaml")
    default = settings_mod.load({}, None, env={}).http
    assert default == "127.0.0.1:9187"
    server = serve(Metrics(), ":0")  # no host given: still loopback
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        assert _listening(port) == {"127.0.0.1"}
    finally:
        server.shutdown()
        server.server_close()


def _listening(port: int) -> set[str]:
    """Addresses listening on TCP ``port``, from /proc/net/tcp{,6}."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.rsplit(":", 1)
            if state != "0A" or int(hexport, 16) != port:
                continue
            if len(addr) == 8:
                out.add(".".join(str(b) for b in reversed(bytes.fromhex(addr))))
            else:
                out.add("ipv6:" + addr)
    return out


# --------------------------------------------------------------------------- planted secrets


def _dump_database(url: str) -> str:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            parts = []
            for table in metadata.sorted_tables:
                rows = c.execute(sa.select(table)).all()
                parts.append(f"== {table.name} ({len(rows)} rows)\n" + "\n".join(map(repr, rows)))
            return "\n".join(parts)
    finally:
        engine.dispose()


def _all_bytes(*roots: Path) -> dict[str, bytes]:
    out = {}
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                out[str(path)] = path.read_bytes()
    return out


def _ids(state: Path, datasource: str) -> collections.Counter:
    """Committed ids of a datasource, read through the Iceberg catalog in the state dir's database."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("reconciler", uri=f"sqlite:///{state / 'reconciler.db'}",
                         warehouse=(state / "segments").as_uri())
    ids = catalog.load_table(f"default.{datasource}").scan(selected_fields=("id",)).to_arrow().column("id")
    catalog.engine.dispose()
    return collections.Counter(ids.to_pylist())


@pytest.mark.kafka
@pytest.mark.rabbitmq
def test_planted_secrets_appear_nowhere(kafka_broker, rabbit_node, topic, stream, tmp_path,
                                        monkeypatch, caplog):
    env_secret = f"envsecret-{secrets.token_hex(12)}"  # Kafka client.id, by ${env:}
    file_secret = f"filesecret{secrets.token_hex(12)}"  # RabbitMQ password, by ${file:}
    wrong_secret = f"wrongsecret{secrets.token_hex(12)}"  # a failing supervisor's password
    planted = (env_secret, file_secret, wrong_secret)
    user = f"planted{secrets.token_hex(4)}"
    rabbit_node.ctl("add_user", user, file_secret)
    rabbit_node.ctl("set_permissions", "-p", "/", user, ".*", ".*", ".*")
    credentials = tmp_path / "credentials"
    credentials.mkdir(mode=0o700)
    (credentials / "rmq-password").write_text(file_secret + "\n")
    (credentials / "rmq-password").chmod(0o600)

    kafka_topic = topic(partitions=2)
    streams = [stream(), stream()]
    records = devservices.make_records(3000)
    devservices.produce_kafka(kafka_broker.bootstrap, kafka_topic, records)
    for s, half in zip(streams, (records[:1500], records[1500:]), strict=True):
        devservices.produce_rabbit(rabbit_node.stream_uri, s, half)
    uri = f"rabbitmq-stream://{user}:${{file:{credentials / 'rmq-password'}}}@127.0.0.1:{rabbit_node.stream_port}/%2f"

    specs, state = tmp_path / "specs", tmp_path / "state"
    specs.mkdir(mode=0o755)
    specs.chmod(0o755)
    (specs / "clicks.yaml").write_text(spec_text(
        "clicks", topic=kafka_topic, bootstrap=kafka_broker.bootstrap,
        extra="backfill: {request: inc-1, resetTo: latest, reason: planted secret test}\n",
    ).replace("  topic:", "  consumerProperties: {client.id: '${env:RECONCILER_TEST_PLANTED}'}\n  topic:"))
    (specs / "orders.yaml").write_text(f"""\
id: orders
source:
  type: rabbitmq
  uri: {uri}
  streams: [{streams[0]}, {streams[1]}]
taskDuration: 500ms
dataSchema:
  datasource: orders
  timestamp: {{column: ts, format: millis}}
  dimensions: [id, user, __key, __partition, __offset]
""")
    (specs / "orders.reset.yaml").write_text('resetTo: latest\nreason: "incident INC-7"\n')

    port = devservices.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILER_")}
    env |= {"RECONCILER_TEST_PLANTED": env_secret, "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable}
    log_path = tmp_path / "run.log"
    command = [str(Path(sys.executable).parent / "reconciler"), "--specs", str(specs), "--state-dir", str(state),
               "--secrets-dir", str(credentials), "--secret-env", "RECONCILER_TEST_PLANTED,RECONCILER_TEST_WRONG",
               "--spark-master", "local[2]", "--tick-interval", "1", "--debounce", "0.1",
               "--http", f":{port}", "--log-level", "DEBUG", "run", "--until-caught-up", "--timeout", "300"]
    bodies: list[str] = []
    listening: set[str] = set()
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                cwd=tmp_path, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 360
            while proc.poll() is None:
                assert time.monotonic() < deadline, "reconciler run did not finish"
                for path in ("/metrics", "/healthz"):
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                            bodies.append(r.read().decode())
                    except OSError as exc:  # 503 while unhealthy still has a body
                        body = getattr(exc, "read", lambda: b"")()
                        if body:
                            bodies.append(body.decode())
                listening |= _listening(port)
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    run_log = log_path.read_text(errors="replace")
    assert proc.returncode == 0, run_log[-5000:]
    assert listening == {"127.0.0.1"}, f"/metrics listened on {listening}"
    assert any("reconciler_" in b for b in bodies), "no /metrics body was fetched"
    assert "DEBUG" in run_log and "published" in run_log

    # exactly once, by key
    want = collections.Counter(k for k, _ in records)
    for ds in ("clicks", "orders"):
        assert _ids(state, ds) == want, ds

    # the operator's view, in this process (status asks the brokers: the secrets resolve here)
    monkeypatch.setenv("RECONCILER_TEST_PLANTED", env_secret)
    monkeypatch.setenv("RECONCILER_TEST_WRONG", wrong_secret)
    monkeypatch.setenv("RECONCILER_SPECS", str(specs))
    monkeypatch.setenv("RECONCILER_STATE_DIR", str(state))
    monkeypatch.setenv("RECONCILER_SECRETS_DIR", str(credentials))
    monkeypatch.setenv("RECONCILER_SECRET_ENV", "RECONCILER_TEST_PLANTED,RECONCILER_TEST_WRONG")
    monkeypatch.setattr(settings_mod, "DEFAULT_CONFIG", tmp_path / "none.yaml")
    caplog.set_level(logging.DEBUG)
    (specs / "bad-auth.yaml").write_text(f"""\
id: bad-auth
source:
  type: rabbitmq
  uri: rabbitmq-stream://{user}:${{env:RECONCILER_TEST_WRONG}}@127.0.0.1:{rabbit_node.stream_port}/%2f
  streams: [{streams[0]}]
dataSchema:
  datasource: bad_auth
  timestamp: {{column: ts}}
""")
    runner = CliRunner()
    outputs = {}
    for args in (["apply"], ["status", "-o", "json"], ["status"], ["status", "bad-auth", "-o", "json"],
                 ["history", "clicks", "-o", "json"], ["history", "orders", "-o", "json"],
                 ["history", "bad-auth", "-o", "json"], ["history", "clicks-backfill-1", "-o", "json"],
                 ["segments", "clicks", "-o", "json"], ["segments", "orders", "-o", "json"],
                 ["plan", "-o", "json"], ["validate"]):
        result = runner.invoke(cli, args)
        outputs[" ".join(args)] = result.output + result.stderr
        assert result.exit_code in (0, 2), (args, result.output, result.stderr)
    status = json.loads(runner.invoke(cli, ["status", "-o", "json"]).stdout)
    by_id = {s["id"]: s for s in status["supervisors"]}
    assert set(by_id) == {"clicks", "clicks-backfill-1", "orders", "orders-backfill-1", "bad-auth"}
    assert by_id["clicks-backfill-1"]["state"] == "COMPLETED"
    assert by_id["orders"]["source"]["uri"] == uri, "references are shown as written"
    assert by_id["clicks"]["source"]["consumerProperties"]["client.id"] == "${env:RECONCILER_TEST_PLANTED}"
    assert by_id["orders"]["streamError"] is None and by_id["orders"]["lag"] == 0
    assert by_id["bad-auth"]["streamError"], "the wrong password must fail (else the test proves nothing)"

    haystack = {
        "reconciler run log (DEBUG, JVM included)": run_log,
        "/metrics and /healthz": "\n".join(bodies),
        "database rows": _dump_database(f"sqlite:///{state / 'reconciler.db'}"),
        "in-process log": caplog.text,
        **{f"reconciler {k}": v for k, v in outputs.items()},
    }
    assert user in haystack["database rows"] and "${file:" in haystack["database rows"], "not the real database"
    files = _all_bytes(state, specs)
    assert any(p.endswith("orders.reset.yaml.applied") for p in files)
    assert any(p.endswith("clicks-backfill-1.yaml") for p in files), "rendered backfill spec"
    for secret in planted:
        leaks = [where for where, text in haystack.items() if secret in text]
        leaks += [path for path, data in files.items() if secret.encode() in data]
        assert leaks == [], f"planted secret {secret[:10]}... found in {leaks}"
