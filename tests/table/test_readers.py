"""The reading example of docs/output.md runs as written (pyiceberg's SqlCatalog, then DuckDB over
the Arrow data) against a table the publish committed; only its paths are replaced."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from reconciler.store.store import Store
from reconciler.table import catalog as cat

PAGE = Path(__file__).resolve().parents[2] / "docs" / "output.md"
SCHEMA = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("user", pa.string()), ("page", pa.string())])


def _readme_example() -> str:
    text = PAGE.read_text()
    section = text[text.index("Reading it (pyiceberg"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_reading_example(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'reconciler.db'}"
    store = Store(db)
    store.migrate()
    tables = cat.Tables(store.engine, tmp_path / "segments")
    table = tables.ensure("clicks", SCHEMA, "hour")
    t0 = datetime(2026, 11, 20, 9, 30, tzinfo=UTC)
    pages = ["home", "cart", "home", "home", "cart", "search"]
    paths = []
    for i, hour in enumerate((t0, t0 + timedelta(hours=1))):  # 09:30 (filtered out) and 10:30
        d = tables.data_dir(table, "b1") / f"time_chunk={hour:%Y%m%dT%H00Z}"
        d.mkdir(parents=True)
        pq.write_table(pa.table({"__time": pa.array([hour] * 3, pa.timestamp("us", tz="UTC")),
                                 "user": ["u1", "u2", "u3"], "page": pages[3 * i:3 * i + 3]}, schema=SCHEMA),
                       d / "part-0.parquet")
        paths.append(str(d / "part-0.parquet"))
    table.add_files(paths)  # committed through pyiceberg's own SqlCatalog commit
    store.close()

    code = (_readme_example()
            .replace("sqlite:////var/lib/stream-reconciler/reconciler.db", db)
            .replace("file:///var/lib/stream-reconciler/segments", (tmp_path / "segments").as_uri()))
    scope: dict = {}
    exec(compile(code, "docs/output.md", "exec"), scope)  # noqa: S102 - the documented example itself
    rows = scope["rows"]
    assert rows.num_rows == 3  # the 10:00 filter leaves the second hour only
    assert sorted(scope["duckdb"].sql("SELECT page, count(*) FROM rows GROUP BY page").fetchall()) == [
        ("cart", 1), ("home", 1), ("search", 1)]
    assert "search" in capsys.readouterr().out  # the example's .show() printed the result
