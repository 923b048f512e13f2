"""The ``source-identity`` audit entry says what it is in words (issue 46, the newcomer's third
look: ``history clicks`` showed the reason ``source identity AaIiZg2g...``, a raw id first)."""

from __future__ import annotations

from reconciler.model import SupervisorSpec
from reconciler.store.store import Store


def test_the_source_identity_entry_says_why_it_is_recorded(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.migrate()
    try:
        store.create_supervisor(SupervisorSpec.from_document({
            "id": "clicks", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9", "topic": "clicks"},
            "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"}}}), None, actor="t")
        store.note_identity("clicks", "AaIiZg2gQ0y", 0, actor="reconciler")
        [entry] = [e for e in store.history("clicks") if e["action"] == "source-identity"]
        assert entry["reason"].startswith("the topic's id recorded, to tell a re-created topic from this one")
        assert entry["reason"].endswith("(id AaIiZg2gQ0y)")
        assert store.source_identity("clicks", 0) == "AaIiZg2gQ0y"  # read from the details, not the reason
    finally:
        store.close()
