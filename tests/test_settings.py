"""Settings: declared once; command line > environment > config file > default."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from reconciler import settings as settings_mod
from reconciler.errors import PermanentError
from reconciler.settings import Settings, describe, load


@pytest.fixture(autouse=True)
def no_system_config(monkeypatch, tmp_path):
    """Never read the host's /etc/stream-reconciler/config.yaml."""
    monkeypatch.setattr(settings_mod, "DEFAULT_CONFIG", tmp_path / "absent" / "config.yaml")


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_defaults():
    s = load({}, None, env={})
    assert s.specs == "specs"
    assert s.state_dir == "state"
    assert s.spark_master == "local[*]"
    assert s.tick_interval == 30.0
    assert s.debounce == 0.3
    assert s.max_termination_share == 0.5
    assert s.lease_ttl == 15.0
    assert s.log_format == "text"
    assert s.db_url == f"sqlite:///{(Path('state') / 'reconciler.db').absolute()}"
    assert s.segments_dir == Path("state") / "segments"


@pytest.mark.parametrize(
    ("cli", "env", "file", "expected"),
    [
        pytest.param({"specs": "from-cli"}, {"RECONCILER_SPECS": "from-env"}, "specs: from-file\n", "from-cli",
                     id="cli-beats-env-and-file"),
        pytest.param({}, {"RECONCILER_SPECS": "from-env"}, "specs: from-file\n", "from-env", id="env-beats-file"),
        pytest.param({"specs": None}, {}, "specs: from-file\n", "from-file", id="file-beats-default"),
        pytest.param({}, {}, "{}\n", "specs", id="default"),
        pytest.param({}, {}, "", "specs", id="empty-config-file"),
    ],
)
def test_precedence(tmp_path, cli, env, file, expected):
    s = load(cli, write_config(tmp_path, file), env=env)
    assert s.specs == expected


def test_precedence_is_per_setting(tmp_path):
    cfg = write_config(tmp_path, "specs: f-specs\ndb: sqlite:///f.db\nsparkMaster: spark://f:7077\n"
                                 "segments: f-seg\n")
    s = load({"db": "sqlite:///cli.db"}, cfg, env={"RECONCILER_SPARK_MASTER": "spark://env:7077"})
    assert (s.specs, s.db, s.spark_master, s.segments) == ("f-specs", "sqlite:///cli.db", "spark://env:7077", "f-seg")
    assert s.db_url == "sqlite:///cli.db"
    assert s.segments_dir == Path("f-seg")


def test_config_path_from_environment(tmp_path):
    cfg = write_config(tmp_path, "stateDir: /srv/rec\n")
    s = load({}, None, env={"RECONCILER_CONFIG": cfg})
    assert s.state_dir == "/srv/rec"
    assert s.db_url == "sqlite:////srv/rec/reconciler.db"


def test_default_config_file_is_read_when_present(tmp_path, monkeypatch):
    path = tmp_path / "etc" / "config.yaml"
    path.parent.mkdir()
    path.write_text("logFormat: json\n")
    monkeypatch.setattr(settings_mod, "DEFAULT_CONFIG", path)
    assert load({}, None, env={}).log_format == "json"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        pytest.param("30s", 30.0, id="seconds"),
        pytest.param("500ms", 0.5, id="milliseconds"),
        pytest.param("5m", 300.0, id="minutes"),
        pytest.param("1h", 3600.0, id="hours"),
        pytest.param("1.5s", 1.5, id="fraction"),
        pytest.param("12", 12.0, id="bare-number-string"),
        pytest.param(7, 7.0, id="number"),
    ],
)
def test_durations(value, seconds):
    assert load({"tick_interval": value}, None, env={}).tick_interval == seconds


def test_durations_from_env_and_file(tmp_path):
    cfg = write_config(tmp_path, "leaseTtl: 1m\ndebounce: 250ms\n")
    s = load({}, cfg, env={"RECONCILER_TICK_INTERVAL": "45s", "RECONCILER_MAX_TERMINATION_SHARE": "0.25"})
    assert (s.tick_interval, s.lease_ttl, s.debounce, s.max_termination_share) == (45.0, 60.0, 0.25, 0.25)


def test_bad_duration_is_an_error():
    with pytest.raises(PermanentError) as exc:
        load({}, None, env={"RECONCILER_TICK_INTERVAL": "soon"})
    assert str(exc.value) == "setting tick_interval: 'soon' is not a number or duration like 30s"


def test_unknown_config_key_is_an_error(tmp_path):
    cfg = write_config(tmp_path, "specs: x\ntickIntervall: 5s\n")
    with pytest.raises(PermanentError) as exc:
        load({}, cfg, env={})
    msg = str(exc.value)
    assert msg.startswith(f"config file {cfg}: unknown setting(s) tickIntervall; known: ")
    assert "tickInterval" in msg


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("- a\n- b\n", "expected a mapping of settings", id="not-a-mapping"),
        pytest.param("specs: [unclosed\n", "not valid YAML", id="bad-yaml"),
    ],
)
def test_bad_config_file(tmp_path, text, message):
    cfg = write_config(tmp_path, text)
    with pytest.raises(PermanentError, match=message):
        load({}, cfg, env={})


def test_missing_config_file_is_an_error(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PermanentError) as exc:
        load({}, str(missing), env={})
    assert str(exc.value) == f"config file {missing}: No such file or directory"


def test_bad_log_format():
    with pytest.raises(PermanentError, match="logFormat must be text or json, not 'xml'"):
        load({"log_format": "xml"}, None, env={})


@pytest.mark.parametrize(
    ("env", "state_dir"),
    [
        pytest.param({"STATE_DIRECTORY": "/var/lib/stream-reconciler"}, "/var/lib/stream-reconciler", id="systemd"),
        pytest.param({"STATE_DIRECTORY": "/var/lib/a:/var/lib/b"}, "/var/lib/a", id="systemd-several"),
        pytest.param({"STATE_DIRECTORY": "/var/lib/a", "RECONCILER_STATE_DIR": "/srv/x"}, "/srv/x",
                     id="explicit-beats-systemd"),
        pytest.param({"STATE_DIRECTORY": ""}, "state", id="empty"),
        pytest.param({}, "state", id="unset"),
    ],
)
def test_state_directory_default(env, state_dir):
    s = load({}, None, env=env)
    assert s.state_dir == state_dir
    assert s.db_url == f"sqlite:///{(Path(state_dir) / 'reconciler.db').absolute()}"
    assert s.segments_dir == Path(state_dir) / "segments"


def test_every_setting_is_described():
    rows = describe()
    assert [r[0] for r in rows] == [f.name for f in fields(Settings)]
    for name, env, key, help_text in rows:
        assert env.startswith("RECONCILER_"), name
        assert key and key[0].islower(), name
        assert len(help_text) > 10, name
    assert len({r[1] for r in rows}) == len(rows)
    assert len({r[2] for r in rows}) == len(rows)


def test_uses_process_environment_by_default(monkeypatch):
    monkeypatch.setenv("RECONCILER_SEGMENTS", "/data/segments")
    monkeypatch.delenv("RECONCILER_CONFIG", raising=False)
    assert load({}, None).segments_dir == Path("/data/segments")


@pytest.mark.parametrize(
    ("env", "ok"),
    [
        pytest.param({"RECONCILER_LOG_LEVEL": "debug"}, True, id="lowercase"),
        pytest.param({"RECONCILER_LOG_LEVEL": "WARNING"}, True, id="uppercase"),
        pytest.param({"RECONCILER_LOG_LEVEL": "verbose"}, False, id="unknown"),
    ],
)
def test_log_level_is_checked(env, ok):
    if ok:
        assert load({}, None, env=env).log_level == env["RECONCILER_LOG_LEVEL"]
    else:
        with pytest.raises(PermanentError, match="logLevel must be DEBUG, INFO, WARNING or ERROR, not 'verbose'"):
            load({}, None, env=env)


def test_spark_conf_merges_file_environment_and_command_line(tmp_path):
    """The config file's `spark:` map, then RECONCILER_SPARK_CONF, then --spark-conf: a key given
    later wins, the others are kept; YAML booleans become Spark's true/false."""
    path = write_config(tmp_path, "spark:\n  spark.executor.memory: 4g\n  spark.executor.cores: 2\n"
                                  "  spark.dynamicAllocation.enabled: false\n")
    env = {"RECONCILER_SPARK_CONF": "spark.executor.cores=3; spark.driver.memory=3g\nspark.a.b=x=y"}
    s = load({"spark_conf": ("spark.driver.memory=5g",)}, path, env=env)
    assert s.spark_conf == {"spark.executor.memory": "4g", "spark.executor.cores": "3",
                            "spark.dynamicAllocation.enabled": "false", "spark.driver.memory": "5g",
                            "spark.a.b": "x=y"}
    assert load({"spark_conf": ()}, None, env={}).spark_conf == {}
    utc = {"spark_conf": ("spark.sql.session.timeZone=Etc/UTC",)}
    assert load(utc, None, env={}).spark_conf == {"spark.sql.session.timeZone": "Etc/UTC"}


@pytest.mark.parametrize(
    ("cli", "env", "file", "message"),
    [
        pytest.param({"spark_conf": ("spark.executor.memory",)}, {}, None, "--spark-conf: 'spark.executor.memory' is not key=value", id="no-equals"),
        pytest.param({}, {"RECONCILER_SPARK_CONF": "=2g"}, None, "RECONCILER_SPARK_CONF: '=2g' is not key=value", id="no-key"),
        pytest.param({"spark_conf": ("executor.memory=2g",)}, {}, None, "does not start with 'spark.'", id="not-spark"),
        pytest.param({}, {}, "spark: [a, b]\n", "spark must be a map", id="file-list"),
        pytest.param({}, {}, "spark:\n  spark.x: {a: 1}\n", "single value", id="file-nested"),
        pytest.param({}, {}, "spark:\n  spark.sql.session.timeZone: America/New_York\n",
                     "timeZone='America/New_York' is not supported: __time, the time chunks", id="time-zone"),
        pytest.param({"spark_master": "spark//host:7077"}, {}, None, "is not a valid URL", id="master-typo"),
        pytest.param({"spark_master": "spark://host"}, {}, None, "is not a valid URL", id="master-no-port"),
        pytest.param({"spark_master": "local[two]"}, {}, None, "is not a valid URL", id="local-typo"),
    ],
)
def test_bad_spark_settings_are_refused_with_the_fix(tmp_path, cli, env, file, message):
    path = write_config(tmp_path, file) if file else None
    with pytest.raises(PermanentError, match=message.replace("[", r"\[")):
        load(cli, path, env=env)


@pytest.mark.parametrize("master", ["local", "local[*]", "local[4]", "local[2,3]", "spark://h:7077",
                                    "spark://h1:7077,h2:7077", "sc://h", "sc://h:15002/;token=x", "yarn",
                                    "k8s://https://api:6443"])
def test_spark_masters_accepted(master):
    assert load({"spark_master": master}, None, env={}).spark_master == master


def test_spark_conf_option_is_repeatable(tmp_path):
    from click.testing import CliRunner

    from reconciler.cli import cli

    args = ["--config", str(write_config(tmp_path, "{}")), "--spark-conf", "spark.a=1", "--spark-conf"]
    ok = CliRunner().invoke(cli, [*args, "spark.b=2", "validate", str(tmp_path / "none.yaml")], env={})
    assert "Spark setting" not in ok.output and "cannot read" in ok.output
    bad = CliRunner().invoke(cli, [*args, "b=2", "validate", str(tmp_path / "none.yaml")], env={})
    assert bad.exit_code == 2 and "Spark setting 'b' does not start with 'spark.'" in bad.output  # a setting


def test_webhook_urls_from_each_source(tmp_path):
    assert load({}, None, env={}).webhooks == ()
    env = {"RECONCILER_WEBHOOK": "https://hooks.example/a/SECRET , http://127.0.0.1:9000/b"}
    assert load({}, None, env=env).webhooks == ("https://hooks.example/a/SECRET", "http://127.0.0.1:9000/b")
    config = write_config(tmp_path, "webhook:\n  - https://one.example/x\n  - https://two.example/y\n")
    assert load({}, config, env={}).webhooks == ("https://one.example/x", "https://two.example/y")
    assert load({"webhook": "http://cli.example/z"}, config, env=env).webhooks == ("http://cli.example/z",)


@pytest.mark.parametrize("url", ["ftp://files.example/SECRET", "hooks.example/SECRET", "https:///SECRET",
                                 "http://host:port/SECRET"])
def test_a_bad_webhook_url_is_refused_without_showing_its_secret(url):
    with pytest.raises(PermanentError, match="is not an http\\(s\\) URL") as err:
        load({}, None, env={"RECONCILER_WEBHOOK": url})
    assert "SECRET" not in str(err.value)


def test_lag_interval():
    assert load({}, None, env={}).lag_interval == 5.0
    assert load({}, None, env={"RECONCILER_LAG_INTERVAL": "2s"}).lag_interval == 2.0
    assert load({"lag_interval": "0"}, None, env={}).lag_interval == 0.0
    with pytest.raises(PermanentError, match="lagInterval"):
        load({"lag_interval": "-1"}, None, env={})
