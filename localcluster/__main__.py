"""`python -m localcluster up|down|status|env`, and `kill NAMESPACE/POD [CONTAINER]`: SIGKILL
to a running container's main process, as `kill -9` on a node (for demos of a crash)."""

from __future__ import annotations

import argparse
import shlex
import sys

from localcluster.cluster import Cluster, ClusterError
from localcluster.kubectl import CommandFailed, KubeCommands


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localcluster", description=__doc__)
    parser.add_argument("command", choices=("up", "down", "status", "env", "kill"))
    parser.add_argument("pod", nargs="?", help="kill: NAMESPACE/POD")
    parser.add_argument("container", nargs="?", help="kill: the container (default: the pod's first)")
    args = parser.parse_args(argv)
    cluster = Cluster()
    try:
        if args.command == "up":
            info = cluster.ensure_up()
            print(f"export KUBECONFIG={info.kubeconfig}")
        elif args.command == "down":
            cluster.down()
        elif args.command == "status":
            return _status(cluster)
        elif args.command == "kill":
            return _kill(cluster, args.pod, args.container)
        else:
            for key, value in cluster.info().env().items():
                print(f"export {key}={shlex.quote(value)}")
    except (ClusterError, CommandFailed) as e:
        print(f"localcluster: {e}", file=sys.stderr)
        return 1
    return 0


def _kill(cluster: Cluster, target: str | None, container: str | None) -> int:
    from localcluster.testing import kill_container

    if not target or "/" not in target:
        print("localcluster: kill needs NAMESPACE/POD", file=sys.stderr)
        return 2
    info = cluster.info()
    namespace, pod = target.split("/", 1)
    container = container or KubeCommands.for_repo(info.kubeconfig, cluster.layout).kubectl(
        "get", "pod", "-n", namespace, pod, "-o", "jsonpath={.spec.containers[0].name}").strip()
    pid = kill_container(info, namespace, pod, container, layout=cluster.layout)
    print(f"killed {namespace}/{pod} container {container} (pid {pid}) with SIGKILL")
    return 0


def _status(cluster: Cluster) -> int:
    statuses = cluster.status()
    for s in statuses:
        state = "healthy" if s.healthy else ("alive, not healthy" if s.alive else "stopped")
        where = f"127.0.0.1:{s.port}" if s.port else "-"
        print(f"{s.name:<24} {where:<16} pid {s.pid or '-':<8} {state}")
    return 0 if all(s.healthy for s in statuses) else 3


if __name__ == "__main__":
    sys.exit(main())
