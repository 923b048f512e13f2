"""The 404 page's links go where their text says (issue 46, the newcomer's third look: the
``/supervisors/ID`` link led to ``/``)."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

from reconciler.observe.metrics import Metrics, not_found, serve

LINK = re.compile(r'<a href="([^"]*)">([^<]*)</a>')


def _path_links(body: str) -> list[tuple[str, str]]:
    """(target, text) of each link whose text is a path."""
    return [(target, text) for target, text in LINK.findall(body) if text.startswith("/")]


def test_each_path_the_404_page_links_is_where_the_link_goes():
    for pages in (True, False):
        links = _path_links(not_found("/nope", pages))
        assert links and all(target == text for target, text in links), links


def test_the_supervisor_page_pattern_is_shown_as_a_pattern_beside_a_link_to_the_list():
    body = not_found("/supervisor/clicks")
    assert "<code>/supervisors/ID</code>" in body
    assert '<a href="/">the status page</a>' in body
    assert "/supervisors/ID" not in not_found("/x", pages=False)  # no pages served: none named


def test_the_served_404_page_links_no_pattern():
    srv = serve(Metrics(), "127.0.0.1:0", page=lambda path: None if path != "/" else "<p>page</p>")
    try:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{srv.server_address[1]}/supervisors/nosuch", timeout=10)
            raise AssertionError("an unknown supervisor answered 200")
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
            body = exc.read().decode()
        links = _path_links(body)
        assert sorted(text for _t, text in links) == ["/", "/healthz", "/metrics"]
        assert all(target == text for target, text in links)
    finally:
        srv.shutdown()
        srv.server_close()
