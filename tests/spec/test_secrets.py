"""What is shown instead of secrets (issue 29): redaction never raises whatever a spec holds,
every librdkafka secret property is hidden, literal URI passwords are scrubbed from free text,
and a database URL is shown without its password."""

from __future__ import annotations

import pytest

from reconciler.daemon import _redacted_url
from reconciler.spec import secrets
from reconciler.spec.uris import UriInvalid, identity, split_stream_uri
from reconciler.streams.rabbitmq.uri import parse_stream_uri

HOSTILE_URIS = [
    "rabbitmq-stream://guest:hostile-pw-1@[fd00::5:5552/%2f",  # Python's parser: Invalid IPv6 URL
    "rabbitmq-stream://guest:hostile-pw-1@host:99999/%2f",  # port out of range
    "rabbitmq-stream://guest:hostile-pw-1@host:abc/%2f",  # port not a number
    "http://[rack-a",
    "x://a:b:c@@@[/?#",
    "rabbitmq-stream://u:${file:/run/a/b}@[::1/",
]


@pytest.mark.parametrize("uri", HOSTILE_URIS)
def test_redaction_never_raises_and_never_shows_a_literal_password(uri):
    shown = secrets.redact_uri(uri)
    assert "hostile-pw-1" not in shown
    doc = secrets.redact({"type": "kafka", "consumerProperties": {"client.rack": uri}, "uri": uri})
    assert "hostile-pw-1" not in repr(doc)
    identity(uri)  # the planner's view of a source never raises either


@pytest.mark.parametrize("uri", HOSTILE_URIS[:3])
def test_a_uri_the_parser_rejects_is_a_clear_error_without_the_password(uri):
    with pytest.raises(UriInvalid):
        split_stream_uri(uri)
    with pytest.raises(Exception) as err:
        parse_stream_uri(uri)
    assert "invalid RabbitMQ stream URI" in str(err.value) and "hostile-pw-1" not in str(err.value)
    # anything that quotes user:password@host later (a client library's own message) is scrubbed
    assert "hostile-pw-1" not in secrets.scrub("cannot connect to guest:hostile-pw-1@host")


LIBRDKAFKA_SECRETS = [
    "sasl.password", "sasl.oauthbearer.config", "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.secret", "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem", "ssl.key.password", "ssl.key.pem", "ssl_key",
    "ssl.keystore.password", "sasl.jaas.config",
]
LIBRDKAFKA_NOT_SECRETS = [
    "sasl.username", "sasl.mechanism", "ssl.key.location", "ssl.keystore.location", "ssl.certificate.pem",
    "ssl.certificate.location", "ssl.ca.pem", "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.credentials.client.id", "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.assertion.private.key.file", "sasl.oauthbearer.assertion.algorithm",
    "sasl.oauthbearer.method", "client.id", "client.rack", "security.protocol",
]


@pytest.mark.parametrize("key", LIBRDKAFKA_SECRETS)
def test_every_librdkafka_secret_property_is_hidden(key):
    assert secrets.is_secret_key(key)
    shown = secrets.redact({"consumerProperties": {key: "literal-PLANTED-3f1c"}})
    assert shown == {"consumerProperties": {key: secrets.REDACTED}}
    assert secrets.literal_secrets({"consumerProperties": {key: "literal-PLANTED-3f1c"}})


@pytest.mark.parametrize("key", LIBRDKAFKA_NOT_SECRETS)
def test_paths_ids_and_urls_are_not_secrets(key):
    assert not secrets.is_secret_key(key)


def test_a_literal_uri_password_is_scrubbed_once_the_spec_is_read(tmp_path):
    from reconciler.spec.loader import load_directory

    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "orders.yaml").write_text(
        "id: orders\nsource: {type: rabbitmq, uri: 'rabbitmq-stream://app:literal-uri-PLANTED@h:5552/%2f', "
        "streams: [o]}\ndataSchema: {datasource: orders, timestamp: {column: ts}}\n")
    assert set(load_directory(str(specs)).by_id()) == {"orders"}
    assert secrets.scrub("connect app:literal-uri-PLANTED@h failed") == "connect app:***@h failed"


def test_the_start_up_line_never_shows_a_database_password():
    url = "postgresql://reconciler:pw-in-userinfo@db/reconciler?password=pw-in-query&sslpassword=pw-ssl"
    assert _redacted_url(url) == "postgresql://reconciler:***@db/reconciler?password=***&sslpassword=***"
    # and, once shown redacted, any other line quoting them is scrubbed too
    assert secrets.scrub("FATAL: password pw-in-query rejected") == "FATAL: password *** rejected"
