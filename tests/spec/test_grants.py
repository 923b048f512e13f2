"""Secrets are granted by the operator (issue 29): a spec reads only files under the secrets
directory and only the environment variables listed, opened without blocking and bounded in
size; anything else is a validation error naming the reference and the setting."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from reconciler import settings as settings_mod
from reconciler.cli import cli
from reconciler.errors import PermanentError
from reconciler.spec import grants, secrets
from reconciler.spec.grants import MAX_SECRET_BYTES, Grants
from reconciler.spec.loader import load_directory

CLEAN_ENV: dict[str, str | None] = {env: None for _, env, _, _ in settings_mod.describe()}
CLEAN_ENV |= {"RECONCILER_CONFIG": None, "STATE_DIRECTORY": None, "CREDENTIALS_DIRECTORY": None}


def spec_text(sid: str, props: dict[str, str]) -> str:
    lines = "".join(f"    {k}: '{v}'\n" for k, v in props.items())
    return (f"id: {sid}\nsource:\n  type: kafka\n  bootstrapServers: 127.0.0.1:9092\n  topic: {sid}\n"
            f"  consumerProperties:\n{lines}dataSchema:\n  datasource: {sid}\n  timestamp: {{column: ts}}\n")


@pytest.fixture
def vault(tmp_path) -> Path:
    """The operator's secrets directory, with one granted secret; another team's file beside it."""
    d = tmp_path / "credentials"
    d.mkdir()
    (d / "kafka-password").write_text("granted-s3cret\n")
    (tmp_path / "other-team-cred").write_text("OTHER-TEAM-PLANTED")
    return d


def _in_thread(fn, timeout: float = 5.0):
    """``fn()`` on a daemon thread: (result or exception); a call that blocks fails the test."""
    out: list = []

    def run():
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"blocked for more than {timeout}s"
    return out[0]


# --------------------------------------------------------------------------- resolution


@pytest.mark.parametrize("form", ["{d}/kafka-password", "kafka-password", "$CREDENTIALS_DIRECTORY/kafka-password"])
def test_a_granted_file_resolves_and_is_taught_to_the_scrubber(vault, monkeypatch, form):
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(vault))
    value = secrets.resolve(f"${{file:{form.format(d=vault)}}}", Grants.of(str(vault), ()))
    assert value == "granted-s3cret"
    assert secrets.scrub("echo granted-s3cret") == "echo ***"


@pytest.mark.parametrize("arg, why", [
    ("{t}/other-team-cred", "outside the secrets directory"),
    ("../other-team-cred", "outside the secrets directory"),
    ("/etc/passwd", "outside the secrets directory"),
    ("/dev/zero", "outside the secrets directory"),
    ("link-out", "resolves through a link"),
    ("fifo", "not a regular file"),
    ("big", f"at most {MAX_SECRET_BYTES}"),
    ("subdir", "not a regular file"),
    ("missing", "cannot read"),
])
def test_a_file_not_granted_is_refused_at_once(vault, tmp_path, arg, why):
    os.symlink(tmp_path / "other-team-cred", vault / "link-out")
    os.mkfifo(vault / "fifo")  # a reader of a FIFO without a writer would wait forever
    (vault / "big").write_bytes(b"x" * (MAX_SECRET_BYTES + 1))
    (vault / "subdir").mkdir()
    g = Grants.of(str(vault), ())
    ref = f"${{file:{arg.format(t=tmp_path)}}}"
    refused = _in_thread(lambda: secrets.resolve(ref, g))
    assert isinstance(refused, PermanentError) and why in str(refused), refused
    checked = _in_thread(lambda: grants.check_file(arg.format(t=tmp_path), g))
    assert checked and (why in checked or "does not exist" in checked or "cannot be read" in checked), checked
    assert "OTHER-TEAM" not in str(refused)


def test_without_a_secrets_directory_no_file_is_read(vault):
    with pytest.raises(PermanentError, match="no secrets directory is granted .*secretsDir"):
        secrets.resolve(f"${{file:{vault}/kafka-password}}", Grants.of(None, ()))


def test_only_listed_environment_variables_resolve_and_each_value_is_scrubbed(monkeypatch):
    monkeypatch.setenv("TEAM_A_TOKEN", "team-a-env-PLANTED")
    monkeypatch.setenv("GRANTED_PW", "granted-env-value-77")
    g = Grants.of(None, "GRANTED_PW, OTHER")
    with pytest.raises(PermanentError, match=r"\$\{env:TEAM_A_TOKEN\} is refused.*secretEnv"):
        secrets.resolve("x${env:TEAM_A_TOKEN}", g)
    assert secrets.resolve("${env:GRANTED_PW}", g) == "granted-env-value-77"
    # librdkafka echoes what it was given: the ${env:} value is hidden like a ${file:} one
    assert "granted-env" not in secrets.scrub("CONFWARN sasl.mechanism set to 'granted-env-value-77'")


def test_properties_that_run_code_or_read_secret_files_are_held_to_the_grants(vault, tmp_path):
    g = Grants.of(str(vault), ())
    with pytest.raises(PermanentError, match="runs a shell command"):
        secrets.resolve_mapping({"sasl.kerberos.kinit.cmd": "cat /etc/shadow"}, g)
    with pytest.raises(PermanentError, match=r'^source.consumerProperties\["ssl.key.location"\]: .*outside the secrets'):
        secrets.resolve_mapping({"ssl.key.location": str(tmp_path / "other-team-cred")}, g)  # named as validation does
    resolved = secrets.resolve_mapping({"ssl.key.location": "kafka-password", "ssl.ca.location": "probe"}, g)
    assert resolved == {"ssl.key.location": str(vault / "kafka-password"), "ssl.ca.location": "probe"}


def test_a_file_a_client_reads_is_never_a_fifo(vault):
    """librdkafka opens its CA and key files while it builds a client, holding Python's lock:
    a FIFO there froze the whole daemon (every thread), which no step time limit can undo."""
    os.mkfifo(vault / "ca.pem")
    g = Grants.of(str(vault), ())
    refused = _in_thread(lambda: secrets.resolve_mapping({"ssl.ca.location": "ca.pem"}, g))
    assert isinstance(refused, PermanentError) and "not a regular file" in str(refused)
    assert "not a regular file" in grants.check_property("ssl.ca.location", "ca.pem", g)
    assert "outside the secrets directory" in grants.check_property("ssl.ca.location", "/tmp/anywhere.pem", g)


def test_grants_are_exported_for_the_processes_started_later(vault, monkeypatch):
    grants.grant(Grants.of(str(vault), ["A", "B"]))
    assert os.environ[grants.ENV_DIR] == str(vault) and os.environ[grants.ENV_NAMES] == "A,B"
    assert Grants.from_environment() == Grants.of(str(vault), ["A", "B"])
    monkeypatch.setattr(grants, "_granted", None)  # a Spark worker: never told, reads the environment
    assert grants.current() == Grants.of(str(vault), ["A", "B"])


def test_secrets_dir_defaults_to_the_credentials_directory(monkeypatch, tmp_path):
    monkeypatch.setattr(settings_mod, "DEFAULT_CONFIG", tmp_path / "none.yaml")
    s = settings_mod.load({}, None, env={"CREDENTIALS_DIRECTORY": "/run/credentials/x"})
    assert s.secrets_dir == "/run/credentials/x"
    s = settings_mod.load({"secrets_dir": "/srv/secrets"}, None, env={"CREDENTIALS_DIRECTORY": "/run/x"})
    assert s.secrets_dir == "/srv/secrets"
    assert settings_mod.load({}, None, env={"RECONCILER_SECRET_ENV": " A, B_2 ,"}).secret_env == "A,B_2"
    with pytest.raises(PermanentError, match="secretEnv: 'A-B' is not an environment variable name"):
        settings_mod.load({}, None, env={"RECONCILER_SECRET_ENV": "A-B"})


# --------------------------------------------------------------------------- validation


def test_loading_against_grants_names_the_reference_the_line_and_the_setting(vault, tmp_path, monkeypatch):
    monkeypatch.setenv("GRANTED_PW", "x")
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "thief.yaml").write_text(spec_text("thief", {
        "client.id": f"${{file:{tmp_path}/other-team-cred}}+${{env:ANY}}"}))
    (specs / "keys.yaml").write_text(spec_text("keys", {"ssl.key.location": str(tmp_path / "other-team-cred")}))
    (specs / "good.yaml").write_text(spec_text("good", {"sasl.password": "${file:kafka-password}",
                                                        "sasl.username": "${env:GRANTED_PW}"}))
    state = load_directory(str(specs), grants=Grants.of(str(vault), ["GRANTED_PW"]))
    assert set(state.by_id()) == {"good"}
    thief = [str(p) for p in state.invalid[str(specs / "thief.yaml")].problems]
    assert thief == [
        f'{specs / "thief.yaml"}:7:16: source.consumerProperties["client.id"]: ${{env:ANY}} is refused: it reads '
        "environment variable ANY, which is not granted: add it to secretEnv, --secret-env, RECONCILER_SECRET_ENV",
        f'{specs / "thief.yaml"}:7:16: source.consumerProperties["client.id"]: ${{file:{tmp_path}/other-team-cred}} '
        f"is refused: it names {tmp_path}/other-team-cred, outside the secrets directory {vault} (secretsDir, "
        "--secrets-dir, RECONCILER_SECRETS_DIR; under systemd LoadCredential= sets it): only files there may be read"]
    [keys] = state.invalid[str(specs / "keys.yaml")].problems
    assert keys.line == 7 and "ssl.key.location reads a file and names" in keys.message
    # without grants (validate in a config repo's CI): syntax only
    assert set(load_directory(str(specs)).by_id()) == {"good", "thief", "keys"}


def test_refused_properties_are_invalid_without_any_grant(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "shell.yaml").write_text(spec_text("shell", {"sasl.kerberos.kinit.cmd": "touch /tmp/x"}))
    (specs / "lib.yaml").write_text(spec_text("lib", {"plugin.library.paths": "/tmp/evil.so"}))
    state = load_directory(str(specs))
    assert not state.specs
    assert "runs a shell command: no spec may set it" in str(state.invalid[str(specs / "shell.yaml")])
    assert "loads a shared library" in str(state.invalid[str(specs / "lib.yaml")])


def test_validate_checks_grants_when_given_and_says_when_it_cannot(vault, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "thief.yaml").write_text(spec_text("thief", {"client.id": f"${{file:{tmp_path}/other-team-cred}}"}))
    runner = CliRunner()
    syntax = runner.invoke(cli, ["validate", str(specs)], env=CLEAN_ENV)
    assert syntax.exit_code == 0, syntax.output
    assert syntax.stdout.splitlines()[0] == (
        "note: secret references were checked for syntax only: no daemon settings here (no config file, "
        "secretsDir, secretEnv or secretGrants); give the daemon's (--config FILE) to check them as the daemon "
        "and `plan` do")
    granted = runner.invoke(cli, ["--secrets-dir", str(vault), "validate", str(specs)], env=CLEAN_ENV)
    assert granted.exit_code == 1
    assert f"{specs / 'thief.yaml'}:7:16: " in granted.stdout and "secretsDir" in granted.stdout
    assert "OTHER-TEAM" not in granted.output + granted.stderr
    by_env = runner.invoke(cli, ["validate", "-o", "json", str(specs)], env=CLEAN_ENV | {
        "RECONCILER_SECRETS_DIR": str(vault)})
    assert by_env.exit_code == 1 and '"secretsChecked": true' in by_env.stdout
    plan = runner.invoke(cli, ["--specs", str(specs), "--state-dir", str(tmp_path / "state"), "plan",
                               "--no-positions"], env=CLEAN_ENV)  # plan always enforces: nothing granted here
    assert plan.exit_code == 1 and "no secrets directory is granted" in plan.stdout


# --------------------------------------------------------------------------- per spec (issue 41.6)


@pytest.fixture
def teams(tmp_path, monkeypatch):
    """Two teams' secrets in one secrets directory, and Team A's spec naming Team B's password."""
    monkeypatch.chdir(tmp_path)
    vault = tmp_path / "credentials"
    vault.mkdir()
    (vault / "team-a-kafka-password").write_text("TEAM-A-s3cret\n")
    (vault / "team-b-kafka-password").write_text("TEAM-B-s3cret\n")
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "team-a-clicks.yaml").write_text(spec_text("team-a-clicks", {
        "sasl.password": "${file:team-a-kafka-password}", "client.id": "${file:team-b-kafka-password}"}))
    (specs / "team-b-orders.yaml").write_text(spec_text("team-b-orders", {
        "sasl.password": "${file:team-b-kafka-password}"}))
    return vault, specs


PER_SPEC = ["--secret-grants", "team-a-*=team-a-*;file:team-b-kafka-password=team-b-*"]


def test_a_spec_using_a_secret_granted_to_another_team_is_refused_by_validate_and_plan(teams, tmp_path):
    vault, specs = teams
    runner = CliRunner()
    base = ["--secrets-dir", str(vault), *PER_SPEC]
    where = f"{specs / 'team-a-clicks.yaml'}:8:16: source.consumerProperties[\"client.id\"]: "
    text = runner.invoke(cli, [*base, "validate", str(specs)], env=CLEAN_ENV)
    assert text.exit_code == 1, text.output
    [line] = [x for x in text.stdout.splitlines() if "team-a-clicks.yaml" in x]
    assert line.startswith(where) and "team-b-kafka-password of the secrets directory" in line
    assert "not granted to spec team-a-clicks" in line and "secretGrants" in line
    assert "team-b-orders" not in text.stdout  # Team B's own use of it is granted
    as_json = runner.invoke(cli, [*base, "validate", "-o", "json", str(specs)], env=CLEAN_ENV)
    assert as_json.exit_code == 1 and '"field": "source.consumerProperties[\\"client.id\\"]"' in as_json.stdout
    plan = runner.invoke(cli, [*base, "--specs", str(specs), "--state-dir", str(tmp_path / "state"), "plan",
                               "--no-positions"], env=CLEAN_ENV)
    assert "not granted to spec team-a-clicks" in plan.stdout, plan.output
    assert "create team-b-orders" in plan.stdout or "team-b-orders" in plan.stdout
    for r in (text, as_json, plan):
        assert "s3cret" not in r.output + r.stderr


def test_per_spec_grants_cover_environment_variables_and_file_properties(teams, monkeypatch):
    vault, _ = teams
    (vault / "team-b.key").write_text("KEY")
    monkeypatch.setenv("TEAM_B_TOKEN", "tok")
    g = Grants.of(str(vault), "TEAM_B_TOKEN", {"env:TEAM_B_*": "team-b-*", "*.key": ["team-b-orders"]})
    from reconciler.spec.references import grant_findings

    doc = {"id": "team-a-clicks", "source": {"type": "kafka", "consumerProperties": {
        "sasl.username": "${env:TEAM_B_TOKEN}", "ssl.key.location": str(vault / "team-b.key")}}}
    found = dict((at[-1], why) for at, why in grant_findings(doc, g, "specs/team-a-clicks.yaml"))
    assert "environment variable TEAM_B_TOKEN, which is not granted to spec team-a-clicks" in found["sasl.username"]
    assert found["ssl.key.location"].startswith("ssl.key.location reads a file and uses file team-b.key")
    assert grant_findings({**doc, "id": "team-b-orders"}, g, "specs/team-b-orders.yaml") == []


def test_without_per_spec_grants_every_spec_may_use_every_secret_with_a_warning(teams, caplog):
    vault, specs = teams
    grants._warned = False
    settings = settings_mod.load({"secrets_dir": str(vault)}, env={})
    with caplog.at_level("WARNING"):
        granted = Grants.from_settings(settings)
    assert "deprecated" in caplog.text and "secretGrants" in caplog.text
    state = load_directory(str(specs), check_permissions=False, grants=granted)
    assert not state.invalid and len(state.specs) == 2


@pytest.mark.parametrize("grant, why", [
    ({"../etc/passwd": "x"}, "does not name secrets"),
    ({"token:x": "x"}, "does not name secrets"),
    ({"x": "team-a/"}, "no subdirectories"),
    ({"x": ""}, "nothing"),
    ("team-a-pw", "entry 1 is not SECRET=SPECS"),
])
def test_a_malformed_per_spec_grant_is_a_setting_error(grant, why):
    with pytest.raises(PermanentError, match=why):
        Grants.of("/run/credentials", "", grant)


def test_per_spec_grants_from_the_config_file_map(teams, tmp_path):
    vault, specs = teams
    config = tmp_path / "config.yaml"
    config.write_text(f"secretsDir: {vault}\nsecretGrants:\n  team-a-*: [team-a-*]\n"
                      "  file:team-b-kafka-password: team-b-*\n")
    granted = Grants.from_settings(settings_mod.load({}, config=str(config), env={}))
    state = load_directory(str(specs), check_permissions=False, grants=granted)
    assert list(state.specs) == [str(specs / "team-b-orders.yaml")]
    assert "not granted to spec team-a-clicks" in str(state.invalid[str(specs / "team-a-clicks.yaml")])


# ------------------------------------ a grant is judged on what is read and on who wrote it
#
# A link inside the secrets directory (``team-a/stolen`` -> ``../team-b/kafka-password``) was
# granted by its own name, to whoever may write in Team A's part, while its target was read;
# and the id a grant is matched against is whatever the file declares (``team-a-clicks.yaml``
# saying ``id: team-b-zzz`` was granted every team-b-* secret), while a config repo's owners
# rules follow file paths.

GRANTS = "team-a/*=team-a-*;team-b/*=team-b-*"


def _vault(tmp_path: Path) -> Path:
    vault = tmp_path / "credentials"
    (vault / "team-a").mkdir(parents=True)
    (vault / "team-b").mkdir()
    (vault / "team-a" / "kafka-password").write_text("TEAM-A-s3cret\n")
    (vault / "team-b" / "kafka-password").write_text("TEAM-B-s3cret\n")
    return vault


def test_a_link_in_a_granted_part_of_the_secrets_directory_does_not_grant_its_target(tmp_path):
    vault = _vault(tmp_path)
    os.symlink("../team-b/kafka-password", vault / "team-a" / "stolen")  # Team A's own part
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "team-a-clicks.yaml").write_text(spec_text("team-a-clicks", {"client.id": "${file:team-a/stolen}"}))
    result = CliRunner().invoke(cli, ["--secrets-dir", str(vault), "--secret-grants", GRANTS,
                                      "validate", str(specs)], env=CLEAN_ENV)
    assert result.exit_code == 1, f"validate accepts it: {result.output}"
    assert "${file:team-a/stolen} is refused: it resolves through a link to team-b/kafka-password" in result.stdout
    assert "s3cret" not in result.output + result.stderr
    # what a client of team-a-clicks would be built with: Team B's password went to Team A's broker
    with pytest.raises(PermanentError, match=r"\$\{file:team-a/stolen\} is refused: it resolves through a link"
                       ) as refused:
        secrets.resolve_mapping({"client.id": "${file:team-a/stolen}"}, Grants.of(str(vault), "", GRANTS))
    assert "s3cret" not in str(refused.value)


def test_the_id_a_spec_declares_is_not_bound_to_its_file_name(tmp_path):
    vault = _vault(tmp_path)
    specs = tmp_path / "specs"
    specs.mkdir()
    # a Team A file (team-a-*.yaml, what a config repo's owners rules see) declaring a Team B id
    (specs / "team-a-clicks.yaml").write_text(spec_text("team-b-zzz", {"client.id": "${file:team-b/kafka-password}"}))
    result = CliRunner().invoke(cli, ["--secrets-dir", str(vault), "--secret-grants", GRANTS,
                                      "validate", str(specs)], env=CLEAN_ENV)
    assert result.exit_code == 1, f"team-a-clicks.yaml is granted team-b/kafka-password: {result.output}"
    assert "not granted to spec team-b-zzz of file team-a-clicks.yaml" in result.stdout


def test_a_link_to_a_file_granted_to_the_same_specs_still_resolves(tmp_path):
    """Rotation by link (``team-a/current`` -> ``kafka-password``) and a shared CA granted to
    every spec stay usable: the target is granted to every spec the link's name is."""
    vault = _vault(tmp_path)
    (vault / "ca.pem").write_text("CA")
    os.symlink("kafka-password", vault / "team-a" / "current")
    os.symlink("../ca.pem", vault / "team-a" / "ca.pem")
    granted = Grants.of(str(vault), "", GRANTS + ";ca.pem=*")
    resolved = secrets.resolve_mapping({"sasl.password": "${file:team-a/current}",
                                        "ssl.ca.location": "team-a/ca.pem"}, granted)
    assert resolved == {"sasl.password": "TEAM-A-s3cret", "ssl.ca.location": str(vault / "ca.pem")}
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "team-a-clicks.yaml").write_text(spec_text("team-a-clicks", {"sasl.password": "${file:team-a/current}"}))
    (specs / "team-b-orders.yaml").write_text(spec_text("team-b-orders", {"ssl.ca.location": "team-a/ca.pem"}))
    state = load_directory(str(specs), check_permissions=False, grants=granted)
    assert not state.invalid and len(state.specs) == 2


@pytest.mark.parametrize("wide, narrow, covered", [
    ("*", "team-a-*", True), ("team-a-*", "team-a-clicks", True), ("team-*", "team-a-*", True),
    ("team-a-*", "team-*", False), ("?", "*", False), ("team-a-clicks", "team-a-*", False),
    ("team-[ab]-*", "team-a-x", True), ("team-[ab]-*", "team-a-*", False),
])
def test_a_link_s_selectors_are_covered_only_when_sure(wide, narrow, covered):
    assert grants._covers(wide, narrow) is covered


def test_validate_with_the_daemons_config_file_checks_as_plan_does(tmp_path, monkeypatch):
    """Issue 46: with a config file that grants nothing (the shipped example's, as installed),
    the daemon and `plan` refuse every secret reference, and validate said "ok" (syntax only).
    The config is the one ``plan`` reads: --config, RECONCILER_CONFIG, else the default path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TEAM_B_PW", "x")
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "clicks.yaml").write_text(spec_text("clicks", {"sasl.password": "${env:TEAM_B_PW}"}))
    config = tmp_path / "config.yaml"
    config.write_text(f"specs: {specs}\nstateDir: {tmp_path / 'state'}\n")
    runner = CliRunner()
    plan = runner.invoke(cli, ["--config", str(config), "plan", "--no-positions"], env=CLEAN_ENV)
    assert plan.exit_code == 1 and "TEAM_B_PW, which is not granted" in plan.stdout, plan.output
    by_option = runner.invoke(cli, ["--config", str(config), "validate"], env=CLEAN_ENV)
    by_env = runner.invoke(cli, ["validate", str(specs)], env=CLEAN_ENV | {"RECONCILER_CONFIG": str(config)})
    monkeypatch.setattr(settings_mod, "DEFAULT_CONFIG", config)
    by_default = runner.invoke(cli, ["validate", str(specs)], env=CLEAN_ENV)
    for result in (by_option, by_env, by_default):
        assert result.exit_code == 1, result.output
        assert "TEAM_B_PW, which is not granted: add it to secretEnv" in result.stdout
        assert "syntax only" not in result.output
    # what the config grants, validate grants: secretEnv and a per-spec grant to another spec
    config.write_text(config.read_text() + "secretEnv: TEAM_B_PW\nsecretGrants: {'env:TEAM_B_PW': team-b}\n")
    other = runner.invoke(cli, ["--config", str(config), "validate"], env=CLEAN_ENV)
    assert other.exit_code == 1 and "not granted to spec clicks" in other.stdout, other.output
    config.write_text(config.read_text().replace("team-b", "clicks"))
    assert runner.invoke(cli, ["--config", str(config), "validate"], env=CLEAN_ENV).exit_code == 0
