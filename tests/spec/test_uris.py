"""One parser for stream URIs (issue 29): a URI ``validate`` accepts, the client opens and the
planner identifies; one it refuses is a problem with file:line, never a failed pass."""

from __future__ import annotations

import pytest

from reconciler.spec.loader import load_directory
from reconciler.spec.uris import UriInvalid, identity, split_stream_uri


def rabbit(uri: str) -> str:
    return (f"id: orders\nsource:\n  type: rabbitmq\n  uri: '{uri}'\n  streams: [o]\n"
            "dataSchema: {datasource: orders, timestamp: {column: ts}}\n")


@pytest.mark.parametrize("uri, why", [
    ("rabbitmq-stream://guest:guest@[fd00::5:5552/%2f", "Invalid IPv6 URL"),
    ("rabbitmq-stream://guest:guest@host:99999/%2f", "out of range"),
    ("rabbitmq-stream://guest:guest@host:port/%2f", "could not be cast"),
    ("rabbitmq-stream://guest:guest@/%2f", "no host"),
])
def test_a_uri_the_client_cannot_open_is_invalid_with_file_and_line(tmp_path, uri, why):
    (tmp_path / "orders.yaml").write_text(rabbit(uri))
    state = load_directory(str(tmp_path))
    [problem] = state.invalid[str(tmp_path / "orders.yaml")].problems
    assert (problem.line, problem.column, problem.field) == (4, 8, "source.uri")
    assert problem.message.startswith("invalid RabbitMQ stream URI: ") and why in problem.message
    assert "guest" not in problem.message  # the field and the problem, never the URI (issue 41.6)
    with pytest.raises(UriInvalid, match=why):
        split_stream_uri(uri)
    host, _ = identity(uri)  # the planner's view never raises (the port is not part of the identity)
    assert host.startswith("unparseable rabbitmq-stream://***@") if "IPv6" in why else host in ("host", "")


def test_references_are_masked_while_the_uri_is_split():
    parts = split_stream_uri("rabbitmq-stream://${env:U}:${file:/run/a/b@c}@Host:5553/v%2Fh")
    assert (parts.host, parts.port, parts.vhost) == ("host", 5553, "v/h")
    assert parts.references == ("${env:U}", "${file:/run/a/b@c}")
    assert identity("rabbitmq-stream://u:${file:/x}@HOST/%2f") == identity("rabbitmq-stream://v:p@host:5552/%2f")


HIDDEN = "Pw-HIDDEN-41"
LEAKY_URIS = [  # urllib's own error text quotes the user information, or a piece of it as the port
    f"rabbitmq-stream://guest:{HIDDEN}＠x@host/%2f",  # a fullwidth ＠ inside the password
    f"rabbitmq-stream://guest:{HIDDEN}＠host/%2f",  # ... or standing for the separator
    f"rabbitmq-stream://guest:{HIDDEN[:4]}/{HIDDEN[4:]}@host/%2f",  # a '/' in the password: "port" 'Pw-H'
    f"rabbitmq-stream://guest:{HIDDEN}@host:{HIDDEN}/%2f",
]


@pytest.mark.parametrize("uri", LEAKY_URIS)
def test_no_uri_parse_error_shows_the_password_in_validate_or_plan(tmp_path, uri):
    from click.testing import CliRunner

    from reconciler.cli import cli
    from tests.spec.test_grants import CLEAN_ENV

    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "orders.yaml").write_text(rabbit(uri))
    runner = CliRunner()
    runs = [runner.invoke(cli, ["validate", str(specs)], env=CLEAN_ENV),
            runner.invoke(cli, ["validate", "-o", "json", str(specs)], env=CLEAN_ENV)]
    for output in ("text", "json"):
        runs.append(runner.invoke(cli, ["--specs", str(specs), "--state-dir", str(tmp_path / "state"), "plan",
                                        "--no-positions", "-o", output], env=CLEAN_ENV))
    for r in runs:
        shown = r.output + r.stderr
        assert "invalid RabbitMQ stream URI" in shown, shown
        assert "source.uri" in shown
        for piece in (HIDDEN, HIDDEN[:4] + "'", HIDDEN[4:]):
            assert piece not in shown, shown
    with pytest.raises(UriInvalid) as err:
        split_stream_uri(uri)
    assert HIDDEN[:4] not in str(err.value)
