"""Persisted pipeline state without Spark: the metadata log, epochs and leases, identity, file indexes, inspection."""
