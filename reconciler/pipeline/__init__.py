"""Spark side of ingestion: a batch as Arrow tasks, the session that runs them.

``batch.run_batch`` cuts a batch's offset ranges into one group of sub-ranges per task
(``sources``) and runs them as Arrow tasks (``tasks``: ``mapInArrow`` over a tiny frame of
task ids). Each task, in an executor's Python worker, reads its sub-ranges with the stream
client, parses and transforms them in pyarrow (``transform``, the JSON rules in
``jsonparse``/``jsonfields``), writes Parquet files (``sink``) and reports them; the driver
keeps what was reported (``segments``) and the caller publishes (database compare-and-swap).
The records never enter Spark's JVM. The session: ``spark`` builds it, ``sparkconf`` says
how it is configured, ``sparkshared`` proves the executors share the warehouse,
``sparkworker`` and ``sparkhome`` make local Python workers start fast, ``sparkcds``
records the JVM's class archive.

May import: ``table`` (a datasource's Arrow schema, the batch directory names),
``streams`` and the ground; never ``runtime`` or anything above (the runtimes call this
package, not the reverse).
"""
