"""The output: one Apache Iceberg table per datasource, in a SQL catalog kept in the
metadata database (catalog ``reconciler``, namespace ``default``, warehouse = the
segments directory).

* ``catalog``: open the catalog, create and evolve tables, stage an append whose
  metadata pointer move is left to the publish transaction (``TableCommit``).
* ``schema``: the Arrow schema and partition transform of a datasource.
* ``offsets``: the offset ranges each snapshot carries, and the data files listing.
* ``verify``: exactly once proven from the snapshots alone.
* ``compact``, ``expire``, ``orphans``, ``upgrade``: table maintenance, one concern each
  (``reach``: what the metadata references; ``reports``: their results as documents).
"""
