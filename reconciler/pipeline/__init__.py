"""Spark side of ingestion: session, Python data sources, transform, segment files.

``batch.run_batch`` reads one set of offset ranges through a Python data source
(``sources``, the readers' fields parsed by ``jsonfields``), parses and rolls up in
Spark's JVM (``transform``), and stages Parquet segments through the sink (``sink``,
``segments``); the caller publishes (database compare-and-swap) and then
``segments.promote``s the files. The session: ``spark`` builds it, ``sparkconf`` says
how it is configured, ``sparkshared`` proves the executors share the segments
directory, ``sparkworker`` and ``sparkhome`` make local Python workers start fast,
``sparkcds`` records the JVM's class archive.

May import: ``table`` (a datasource's Arrow schema, the batch directory names),
``streams`` and the ground; never ``runtime`` or anything above (the runtimes call this
package, not the reverse).
"""
