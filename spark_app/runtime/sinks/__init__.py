"""Sinks: where a query's batches go, each batch exactly once (a JSON-lines changelog, a
Delta table), and the contract every output and sink follows (``base``)."""
