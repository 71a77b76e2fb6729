"""bench-shared (b): one of three readers of the shared table's changes; each writes the
changes it reads (the same rows as a recomputing pipeline's output, without its state)."""

import argparse

import spark_app as sa

parser = argparse.ArgumentParser()
parser.add_argument("--publisher-state", required=True)
parser.add_argument("--output", required=True)
parser.add_argument("--state", required=True)
parser.add_argument("--trigger-interval-ms", type=int, default=500)
args = parser.parse_args()

changes = sa.io.tables.read("bench/customers", persistent_id="customers", location=args.publisher_state)
sa.io.jsonlines.write(changes, args.output)
sa.run(persistence_config=sa.persistence.Config.simple_config(sa.persistence.Backend.from_uri(args.state)),
       trigger_interval_ms=args.trigger_interval_ms)
