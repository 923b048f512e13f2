"""The output: one Apache Iceberg table per datasource, in a SQL catalog kept in the
metadata database (catalog ``reconciler``, namespace ``default``, warehouse = the
segments directory).

* ``catalog``: open the catalog, create and evolve tables, stage an append whose
  metadata pointer move is left to the publish transaction (``TableCommit``).
* ``schema``: the Arrow schema and partition transform of a datasource.
* ``offsets``: the offset ranges each snapshot carries, and the data files listing.
* ``verify``: exactly once proven from the snapshots alone.
* ``maintenance``: compaction, snapshot expiry, orphan files, the one-off import of
  the old segment layout.
"""
