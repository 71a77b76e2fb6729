"""Each pod's /etc/hosts: the host's names, the pod's own, and the cluster's Services as the
pod's resolver would find them through DNS."""

from pathlib import Path

from localcluster.kubelet.hosts import hosts_file, service_key, write_in_place

POD = {"metadata": {"name": "reader", "namespace": "team-a"}, "spec": {}}
HOST = "127.0.0.1 localhost\n127.0.0.1 vm\n"


def addresses(content: str) -> dict[str, str]:
    """name -> the address its first line gives (as the resolver reads the file)."""
    found: dict[str, str] = {}
    for line in content.splitlines():
        fields = line.split("#", 1)[0].split()
        for name in fields[1:]:
            found.setdefault(name, fields[0])
    return found


def test_a_service_of_the_pods_namespace_resolves_by_its_short_and_qualified_names() -> None:
    names = addresses(hosts_file(POD, HOST, [("team-a", "kafka")]))
    for name in ("kafka", "kafka.team-a", "kafka.team-a.svc", "kafka.team-a.svc.cluster.local"):
        assert names[name] == "127.0.0.1"


def test_a_service_of_another_namespace_resolves_only_by_its_qualified_names() -> None:
    names = addresses(hosts_file(POD, HOST, [("team-b", "kafka")]))
    assert "kafka" not in names
    assert names["kafka.team-b.svc.cluster.local"] == "127.0.0.1" and names["kafka.team-b"] == "127.0.0.1"


def test_the_hosts_own_names_the_pods_hostname_and_its_host_aliases_stay() -> None:
    pod = {**POD, "spec": {"hostAliases": [{"ip": "10.0.0.9", "hostnames": ["db", "db.example"]}]}}
    names = addresses(hosts_file(pod, HOST, []))
    assert names["vm"] == "127.0.0.1" and names["localhost"] == "127.0.0.1"
    assert names["reader"] == "127.0.0.1"
    assert names["db.example"] == "10.0.0.9"


def test_an_external_name_service_is_not_an_address() -> None:
    external = {"metadata": {"namespace": "a", "name": "x"}, "spec": {"type": "ExternalName"}}
    assert service_key(external) is None
    assert service_key({"metadata": {"namespace": "a", "name": "y"}, "spec": {}}) == ("a", "y")


def test_rewriting_keeps_the_inode_that_a_bind_mount_holds(tmp_path: Path) -> None:
    path = tmp_path / "etc-hosts"
    write_in_place(path, "127.0.0.1 a b c d e f\n")
    inode = path.stat().st_ino
    write_in_place(path, "127.0.0.1 a\n")
    assert path.stat().st_ino == inode
    assert path.read_text() == "127.0.0.1 a\n"
