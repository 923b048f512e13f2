"""Spark side of ingestion: session, Python data sources, transform, segment files.

``batch.run_batch`` reads one set of offset ranges through a Python data source,
parses and rolls up in Spark's JVM, and stages Parquet segments; the caller
publishes (database compare-and-swap) and then ``segments.promote``s the files.
"""
