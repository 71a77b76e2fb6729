"""Shared tables: one pipeline maintains a keyed table, others read it.

* ``publish``     the publisher's output: a Delta table under its state, one version per
                  committed batch (a keyed MERGE with the batch as Delta's transaction id).
* ``compaction``  the publisher's compaction, in a thread of its own: OPTIMIZE, then the
                  files and log entries that no reader's hold needs (spark_app.state.compaction).
* ``changelog``   a reader's stream of a table's changes, with ``diff`` (+1/-1).
* ``lookup``      a reader's static view of a table's latest version, per batch.
* ``readers``     a reader's holds: registered before it reads, moved after each commit.
* ``location``    where a table is, and how Spark and spark_app's storage reach it.
"""
