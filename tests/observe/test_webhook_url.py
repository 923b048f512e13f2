"""Two URLs the settings accepted that ``post`` mishandled (review of 8d2d57c, webhook_post).

* ``http://[::1]/hook`` (an IPv6 literal without a port): ``post`` hands the bare hostname
  ``::1`` and port None to ``http.client``, which reads the text after the last ':' as the
  port: it connects to host ':' port 1, never to [::1]:80. Every event is retried forever,
  the endpoint shown failing with a name-lookup error.
* A path with a control character: ``http.client`` refuses it with the path in ``repr``
  (``\\x01`` escaped), so ``describe``'s ``text.replace(path, "...")`` finds nothing to hide
  and the token reaches ``status``, the log and the cursor row ("a message never holds the
  URL's path").
"""

from __future__ import annotations

import http.client
import socket
import threading

import pytest

from reconciler.errors import PermanentError
from reconciler.observe import webhook_post
from reconciler.observe.webhook import endpoint_label
from reconciler.observe.webhook_post import DeliveryFailed, describe, post
from reconciler.settings import webhook_urls


def test_an_ipv6_literal_url_without_a_port_is_delivered_to_port_80():
    try:
        srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("::1", 80))
    except OSError as exc:
        pytest.skip(f"cannot listen on [::1]:80 here: {exc}")
    srv.listen(4)
    got: list[bytes] = []

    def serve():
        conn, _ = srv.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            got.append(data)
            conn.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    url = "http://[::1]/hook"
    try:
        assert webhook_urls(url) == (url,)  # the settings take it
        post(url, {"type": "test", "id": 1}, timeout=3)
        assert got and got[0].startswith(b"POST /hook ")
    finally:
        srv.close()


def test_a_control_character_in_the_path_does_not_show_the_token():
    url = "https://hooks.example.com/services/T0/B0/SECRETTOKEN\x01"
    with pytest.raises(PermanentError, match="no space nor control character") as refused:
        webhook_urls(url)  # the settings refuse it now
    assert "SECRETTOKEN" not in str(refused.value) and "https://hooks.example.com..." in str(refused.value)
    with pytest.raises(DeliveryFailed) as failed:
        post(url, {"type": "test", "id": 1}, timeout=2)
    assert "SECRETTOKEN" not in str(failed.value), str(failed.value)


@pytest.mark.parametrize("url", ["https://h.example.com/a b/TOKEN", "https://h.example.com/\tTOKEN",
                                 "https://h.example.com/TO\u2028KEN", "https://h.example.com/TOKEN\x7f"])
def test_spaces_and_control_characters_are_refused_by_the_settings(url):
    with pytest.raises(PermanentError) as refused:
        webhook_urls(url)
    assert "TOKEN" not in str(refused.value)


def test_a_failure_message_never_quotes_the_exception_s_text():
    """Whatever http.client's wording (here the path escaped, as it quotes a path it refuses),
    the message is built from the exception's type and scheme://host:port."""
    url = "https://hooks.example.com/services/SECRETTOKEN"
    exc = http.client.InvalidURL("URL can't contain control characters. '/services/SECRETTOKEN\\x01' (found '\\x01')")
    assert describe(exc, url) == "InvalidURL (https://hooks.example.com:443)"
    assert describe(ConnectionRefusedError(111, "SECRETTOKEN"), url) == (
        "ConnectionRefusedError: Connection refused (https://hooks.example.com:443)")
    assert describe(TimeoutError("SECRETTOKEN"), "http://[::1]:8080/SECRETTOKEN") == "TimeoutError: timed out (http://[::1]:8080)"


def test_a_control_character_in_a_hostname_is_shown_escaped():
    with pytest.raises(PermanentError) as refused:
        webhook_urls("https://relay:pw@ho\x1bst.example.com/x")
    assert "\x1b" not in str(refused.value) and "https://ho\\x1bst.example.com..." in str(refused.value)
    assert endpoint_label("https://ho\x1bst.example.com/x").startswith("https://ho\\x1bst.example.com#")


def test_an_ipv6_literal_without_a_port_is_delivered_to_the_scheme_s_default_port(monkeypatch):
    """As above where [::1]:80 cannot be listened on: the default port, whatever it is, is passed."""
    try:
        srv = socket.create_server(("::1", 0), family=socket.AF_INET6)
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    monkeypatch.setattr(webhook_post, "_default_port", lambda scheme: srv.getsockname()[1])
    got: list[bytes] = []

    def serve():
        conn, _ = srv.accept()
        with conn:
            got.append(conn.recv(65536))
            conn.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    try:
        post("http://[::1]/hook", {"type": "test", "id": 1}, timeout=3)
        assert got and got[0].startswith(b"POST /hook ")
    finally:
        srv.close()
