"""The runtime in the driver pod: what happens between ``spark_app.run()`` and the exit code.

* ``pipeline``  the declared dataflow: sources, outputs, the queries that join them, the
                SparkSession they use (declarations collect here until ``run``).
* ``driver``    a driver's life: open the state (epoch, fencing), start one streaming
                query per output, restart a query after a transient failure, report,
                stop gracefully, end with an exit code the operator reads.
* ``commit``    the per-batch commit protocol (Spark's foreachBatch): stage, commit to the
                metadata log, publish; the sources' offsets read from Spark's offset log.
* ``sources/``  where input comes from, with offsets that commit with each batch: files
                on a filesystem or S3 (``files``, ``inputs``, ``parsing``).
* ``sinks/``    where batches go, each exactly once: a JSON-lines changelog, a Delta
                table (``base`` is the contract every output follows).
* ``iterate/``  the fixed-point operator whose result is stored and warm-started.
* ``jvm/``      the JVM: SparkSession settings, the class archive, the workers' Python.
* ``plan``      reading a query's logical plan: its stateful operators and output key.
* ``reporting`` the driver's progress, as an annotation on its own pod.

Below the runtime (no Spark): ``spark_app.state`` (metadata log, leases, file indexes),
``spark_app.storage`` (filesystem and S3 backends), ``spark_app.contract``.
"""
