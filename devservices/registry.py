"""A minimal Confluent-compatible schema registry, for tests and benchmarks (loopback only).

It answers the REST calls confluent-kafka's ``SchemaRegistryClient``, ``AvroSerializer``
and ``ProtobufSerializer`` make, and nothing more:

* ``POST /subjects/{s}/versions``: register (the same schema text under a subject gives
  its existing id); ``POST /subjects/{s}``: look a schema up;
* ``GET /schemas/ids/{id}`` (404 with error_code 40403 for an unknown id),
  ``GET /subjects/{s}/versions/latest`` and ``/versions/{v}``, ``GET /subjects``;
* ``GET /associations/resources/{ns}/{topic}``: always none (the serializers then name the
  subject ``<topic>-value`` themselves).

What a real registry (Confluent, Karapace, Apicurio, Redpanda) does differently: it keeps
schemas in a Kafka topic (here: memory, gone with the process), checks compatibility on
register (here: every schema is accepted), normalizes and parses schemas (here: compared
as text), resolves references, and has modes, configs, contexts, deletes and ACLs.

``requests`` counts every request by path (tests check caching), ``down()`` / ``up()``
make it refuse connections, and ``auth=(user, password)`` requires HTTP Basic auth.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

_SUBJECT_VERSIONS = re.compile(r"^/subjects/([^/]+)/versions$")
_SUBJECT_VERSION = re.compile(r"^/subjects/([^/]+)/versions/(latest|-?\d+)$")
_SUBJECT = re.compile(r"^/subjects/([^/]+)$")
_SCHEMA_ID = re.compile(r"^/schemas/ids/(\d+)$")


class Registry:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, auth: tuple[str, str] | None = None):
        self.host, self.port, self.auth = host, port, auth
        self.schemas: dict[int, dict] = {}  # id -> {"schema", "schemaType", "references"}
        self.subjects: dict[str, list[int]] = {}  # subject -> ids by version
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Registry:
        registry = self

        class Handler(_Handler):
            owner = registry

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    down = stop  # connections are refused until up(): what a registry that is down looks like

    def up(self) -> None:
        self.start()

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def register(self, subject: str, schema: str, schema_type: str = "AVRO",
                 references: list | None = None) -> int:
        doc = {"schema": schema, "schemaType": schema_type.upper(), "references": references or []}
        with self._lock:
            sid = next((i for i, known in self.schemas.items() if known == doc), 0)
            if not sid:
                sid = len(self.schemas) + 1
                self.schemas[sid] = doc
            versions = self.subjects.setdefault(subject, [])
            if sid not in versions:
                versions.append(sid)
            return sid

    def version(self, subject: str, version: str) -> dict | None:
        versions = self.subjects.get(subject) or []
        v = len(versions) if version in ("latest", "-1") else int(version)
        if not 1 <= v <= len(versions):
            return None
        sid = versions[v - 1]
        return {"subject": subject, "version": v, "id": sid, **self._public(sid)}

    def _public(self, sid: int) -> dict:
        doc = self.schemas[sid]
        out = {"schema": doc["schema"], "references": doc["references"]}
        if doc["schemaType"] != "AVRO":  # as Confluent: AVRO is the default and left out
            out["schemaType"] = doc["schemaType"]
        return out


class _Handler(BaseHTTPRequestHandler):
    owner: Registry

    def log_message(self, *args: object) -> None:  # quiet: tests read counts, not logs
        pass

    def _send(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        auth = self.owner.auth
        if auth is None:
            return True
        expected = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        if self.headers.get("Authorization") == expected:
            return True
        self._send(401, {"error_code": 401, "message": "Unauthorized"})
        return False

    def _route(self, method: str) -> None:
        path = urlparse(self.path).path
        self.owner.requests[f"{method} {path}"] += 1
        if not self._authorized():
            return
        body = {}
        if method == "POST":
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
        reg = self.owner
        if method == "GET" and (m := _SCHEMA_ID.match(path)):
            sid = int(m[1])
            if sid not in reg.schemas:
                return self._send(404, {"error_code": 40403, "message": "Schema not found"})
            return self._send(200, {"id": sid, **reg._public(sid)})
        if method == "GET" and path.startswith("/associations/resources/"):
            return self._send(200, [])  # the serializers ask which subject a topic uses: none
        if method == "GET" and path == "/subjects":
            return self._send(200, sorted(reg.subjects))
        if method == "GET" and (m := _SUBJECT_VERSION.match(path)):
            found = reg.version(unquote(m[1]), m[2])
            if found is None:
                return self._send(404, {"error_code": 40402, "message": "Version not found"})
            return self._send(200, found)
        if method == "POST" and (m := _SUBJECT_VERSIONS.match(path)):
            sid = reg.register(unquote(m[1]), body["schema"], body.get("schemaType") or "AVRO",
                               body.get("references"))
            return self._send(200, {"id": sid})
        if method == "POST" and (m := _SUBJECT.match(path)):
            subject = unquote(m[1])
            for v, sid in enumerate(reg.subjects.get(subject, []), 1):
                if reg.schemas[sid]["schema"] == body.get("schema"):
                    return self._send(200, {"subject": subject, "version": v, "id": sid, **reg._public(sid)})
            return self._send(404, {"error_code": 40403, "message": "Schema not found"})
        return self._send(404, {"error_code": 404, "message": f"not implemented here: {method} {path}"})

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")
