"""The spark_app command line.

    python -m spark_app run PIPELINE.py [ARGS...]   run a pipeline file (or -m module)
    python -m spark_app inspect URI [--json]        the latest commit stored at URI, and any damage
    python -m spark_app repair URI [--yes]          fall back from damaged state where that is safe
    python -m spark_app reset URI --yes             delete the stored state at URI
    python -m spark_app tables URI [--json]         the shared tables a state root publishes: versions, holds
    python -m spark_app tables release --reader NS/NAME [URI...]
                                                    drop a deleted reader's holds (default: the tables of
                                                    $SPARK_APP_TABLE_INPUTS, as the operator injects them)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from spark_app import contract
from spark_app.persistence import Backend


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_app", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a pipeline file or module")
    run.add_argument("-m", dest="module", action="store_true", help="PIPELINE is a module name")
    run.add_argument("pipeline")
    run.add_argument("args", nargs=argparse.REMAINDER)
    for name, text in (("inspect", "print the latest commit of stored state"),
                       ("repair", "remove damaged state files where that is safe (a dry run without --yes)"),
                       ("reset", "delete stored state (metadata and snapshots)")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("uri", help="a state folder, or s3://bucket/prefix")
        sub.add_argument("--snapshot-uri", help="snapshot storage, if not the same as URI")
        sub.add_argument("--endpoint-url", default=os.environ.get(contract.S3_ENDPOINT))
        sub.add_argument("--region", default=os.environ.get(contract.S3_REGION))
        if name == "inspect":
            sub.add_argument("--json", action="store_true", help="machine-readable output")
            sub.add_argument("--sizes", action="store_true", help="also sum the stored bytes (lists everything)")
        else:
            sub.add_argument("--yes", action="store_true", help="really change the stored state")
    tables = commands.add_parser("tables", help="shared tables: their versions and holds, or release holds")
    tables.add_argument("action", nargs="?", choices=["show", "release"], default="show")
    tables.add_argument("uris", nargs="*", help="a publisher's state root (show) or tables' folders (release)")
    tables.add_argument("--reader", help="namespace/pipeline whose holds to release")
    tables.add_argument("--json", action="store_true")
    tables.add_argument("--endpoint-url", default=os.environ.get(contract.S3_ENDPOINT))
    tables.add_argument("--region", default=os.environ.get(contract.S3_REGION))
    options, extra = parser.parse_known_args(argv)
    # `tables release --reader NS/NAME URI...`: argparse matches both positionals (the action
    # and the URIs, which may be none) before the option, so URIs after it come back unparsed
    # (bpo-14191; parse_intermixed_args does not take subcommands). They are the URIs.
    if extra and options.command == "tables" and not any(e.startswith("-") for e in extra):
        options.uris, extra = [*options.uris, *extra], []
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if options.command == "tables":
        return _tables(options)
    if options.command == "run":
        from spark_app.entrypoint import run_pipeline

        return run_pipeline(options.pipeline, options.args, module=options.module)
    metadata = Backend.from_uri(options.uri, endpoint_url=options.endpoint_url, region=options.region)
    snapshots = Backend.from_uri(options.snapshot_uri or options.uri, endpoint_url=options.endpoint_url,
                                 region=options.region)
    if options.command == "inspect":
        return _inspect(metadata, snapshots, options.json, options.sizes)
    if options.command == "repair":
        return _repair(metadata, snapshots, options.yes)
    return _reset(metadata, snapshots, options.yes)


def _inspect(metadata: Backend, snapshots: Backend, as_json: bool, sizes: bool) -> int:
    from spark_app.state.inspect import inspect, render
    from spark_app.storage import StorageError

    try:
        report = inspect(metadata.storage(), snapshots.storage(), sizes=sizes)
    except StorageError as error:
        print(f"cannot read {metadata.root}: {error}", file=sys.stderr)
        return contract.EXIT_MISCONFIGURED
    print(json.dumps(report, indent=2, sort_keys=True) if as_json else render(report))
    return 0


def _tables(options: argparse.Namespace) -> int:
    from spark_app.state.inspect import describe_tables, inspect_tables, release_holds

    def backend(uri: str) -> Backend:
        return Backend.from_uri(uri, endpoint_url=options.endpoint_url, region=options.region)

    if options.action == "show":
        if len(options.uris) != 1:
            print("tables show takes one state root", file=sys.stderr)
            return contract.EXIT_MISCONFIGURED
        report = inspect_tables(backend(options.uris[0]).storage())
        print(json.dumps(report, indent=2, sort_keys=True) if options.json else describe_tables(report))
        return 0
    if not options.reader or options.reader.count("/") != 1:
        print("tables release needs --reader NAMESPACE/PIPELINE", file=sys.stderr)
        return contract.EXIT_MISCONFIGURED
    environment = contract.DriverEnvironment.from_env(os.environ)
    folders = [backend(uri) for uri in options.uris] or [
        Backend.from_uri(i.uri, options=i.s3) for i in environment.table_inputs]
    keys = {i.uri: environment.table_keys.get(i.credentials) for i in environment.table_inputs}
    released = release_holds(folders, options.reader, keys)
    for line in released:
        print(line)
    return 0


def _repair(metadata: Backend, snapshots: Backend, yes: bool) -> int:
    from spark_app.state.repair import apply_repair, plan_repair, render
    from spark_app.state.session import LeaseDamaged, read_lease

    storage, snapshot_storage = metadata.storage(), snapshots.storage()
    try:
        lease = read_lease(storage)
    except LeaseDamaged:
        lease = None
    if lease is not None and lease.is_live(int(__import__("time").time() * 1000)):
        print(f"refusing to repair: a live driver holds the state ({lease.holder.describe()}); stop it first",
              file=sys.stderr)
        return contract.EXIT_ALREADY_RUNNING
    plan = plan_repair(storage, snapshot_storage)
    print(render(plan))
    if not plan.damage:
        return 0
    if not plan.safe:
        print("nothing was changed: part of the damage cannot be repaired safely", file=sys.stderr)
        return contract.EXIT_MISCONFIGURED
    if not yes:
        print("run again with --yes to repair", file=sys.stderr)
        return 1
    folder = apply_repair(storage, snapshot_storage, plan)
    print(f"repaired; what was removed is kept under {folder} of the state")
    return 0


def _reset(metadata: Backend, snapshots: Backend, yes: bool) -> int:
    from spark_app.state.session import read_lease

    storage = metadata.storage()
    lease = read_lease(storage)
    if lease is not None and lease.is_live(int(__import__("time").time() * 1000)):
        print(f"refusing to reset: a live driver holds the state ({lease.holder.describe()}); stop it first",
              file=sys.stderr)
        return contract.EXIT_ALREADY_RUNNING
    if not yes:
        print(f"this deletes all stored state at {metadata.root} and {snapshots.root}; "
              "run again with --yes to do it", file=sys.stderr)
        return 1
    removed = storage.delete_prefix("")
    if snapshots != metadata:
        removed += snapshots.storage().delete_prefix("")
    print(f"deleted {removed} stored objects; the next run starts from empty state")
    return 0


if __name__ == "__main__":
    sys.exit(main())
