"""The output: one Apache Iceberg table per datasource, in a SQL catalog kept in the
metadata database (catalog ``reconciler``, namespace ``default``, warehouse = the
segments directory).

* ``catalog``: open the catalog, create and evolve tables, stage an append whose
  metadata pointer move is left to the publish transaction (``TableCommit``);
  ``datafiles`` describes a batch's Parquet files for it, ``durable`` makes what a commit
  references durable first, ``retention`` keeps the history short as it commits.
* ``schema``: the Arrow schema and partition transform of a datasource.
* ``files``, ``summary``, ``reach``: what the table holds (data files, the offset ranges
  each snapshot carries, every file its metadata references); ``writeids`` finds the write
  a file belongs to from its path; ``locations`` and ``storage``, where files live.
* ``verify``: exactly once proven from the snapshots, the files and the rows.
* ``compact``, ``expire``, ``orphans``, ``upgrade``: table maintenance, one concern each
  (``reports``: their results as documents).

May import: ``store`` (maintenance commits through the write fences and catches their
conflicts), the layers below it and the ground; never ``pipeline``, ``runtime`` or
anything above.
"""
