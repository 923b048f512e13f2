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
    assert problem.message.startswith("invalid RabbitMQ stream URI 'rabbitmq-stream://guest:***@") and why in problem.message
    with pytest.raises(UriInvalid, match=why):
        split_stream_uri(uri)
    host, _ = identity(uri)  # the planner's view never raises (the port is not part of the identity)
    assert host.startswith("unparseable rabbitmq-stream://guest:***@") if "IPv6" in why else host in ("host", "")


def test_references_are_masked_while_the_uri_is_split():
    parts = split_stream_uri("rabbitmq-stream://${env:U}:${file:/run/a/b@c}@Host:5553/v%2Fh")
    assert (parts.host, parts.port, parts.vhost) == ("host", 5553, "v/h")
    assert parts.references == ("${env:U}", "${file:/run/a/b@c}")
    assert identity("rabbitmq-stream://u:${file:/x}@HOST/%2f") == identity("rabbitmq-stream://v:p@host:5552/%2f")
