"""Command lines, kubeconfigs, ports and the PKI of the control plane."""

import base64
import ipaddress
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from localcluster import cluster, controlplane
from localcluster.controlplane import Ports, choose_ports
from localcluster.layout import Layout
from localcluster.pki import TOKEN_USERS, Pki, TokenUser, ensure_pki, token_file_text

LAYOUT = Layout(repo=Path("/repo"), venv=Path("/repo/.venv"))
PORTS = Ports(etcd=1, etcd_peer=2, apiserver=3, controller_manager=4, s3=5, node_agent=6)


def flags(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)


def test_apiserver_flags_enforce_rbac_tokens_and_service_accounts() -> None:
    f = flags(controlplane.apiserver_command(LAYOUT, PORTS))
    assert f["bind-address"] == "127.0.0.1"
    assert f["secure-port"] == "3"
    assert f["etcd-servers"] == "http://127.0.0.1:1"
    assert f["authorization-mode"] == "Node,RBAC"
    assert f["token-auth-file"].endswith("pki/tokens.csv")
    assert f["endpoint-reconciler-type"] == "none"
    assert f["service-cluster-ip-range"] == "10.96.0.0/16"
    for name in ("service-account-issuer", "service-account-key-file", "service-account-signing-key-file"):
        assert f[name]
    for name in ("kubelet-client-certificate", "kubelet-client-key", "kubelet-certificate-authority"):
        assert f[name].startswith("/repo/.cache/cluster/pki/")


def test_controller_manager_uses_per_controller_credentials() -> None:
    f = flags(controlplane.controller_manager_command(LAYOUT, PORTS))
    assert f["use-service-account-credentials"] == "true"
    assert f["root-ca-file"].endswith("ca.crt")
    assert f["service-account-private-key-file"].endswith("sa.key")
    assert f["controllers"].startswith("*,")
    assert f["bind-address"] == "127.0.0.1"


def test_no_endpoint_controller_tries_to_publish_loopback_pod_ips() -> None:
    disabled = {c.removeprefix("-") for c in flags(controlplane.controller_manager_command(LAYOUT, PORTS))[
        "controllers"].split(",") if c.startswith("-")}
    assert {"endpoints-controller", "endpointslice-controller"} <= disabled


def test_everything_listens_on_loopback() -> None:
    etcd = flags(controlplane.etcd_command(LAYOUT, PORTS))
    assert etcd["listen-client-urls"] == "http://127.0.0.1:1"
    assert etcd["listen-peer-urls"] == "http://127.0.0.1:2"
    assert controlplane.s3_command(LAYOUT, PORTS)[-4:] == ["-H", "127.0.0.1", "-p", "5"]
    assert "--port=6" in controlplane.node_agent_command(LAYOUT, PORTS)


def test_previous_ports_are_kept_when_free_and_never_duplicated() -> None:
    fresh = iter([100, 101, 102, 103])
    previous = {"etcd": 10, "etcd-peer": 10, "kube-apiserver": 11, "s3": 12}
    ports = choose_ports(previous, is_free=lambda p: p != 12, fresh=lambda: next(fresh))
    assert ports.etcd == 10
    assert ports.apiserver == 11
    assert len(set(ports.as_dict().values())) == 6
    assert ports.s3 != 12


def test_kubeconfig_has_the_token_and_inline_ca() -> None:
    config = controlplane.kubeconfig("https://127.0.0.1:3", b"PEM", "admin", "tok")
    parsed = yaml.safe_load(yaml.safe_dump(config))
    assert parsed["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:3"
    assert base64.b64decode(parsed["clusters"][0]["cluster"]["certificate-authority-data"]) == b"PEM"
    assert parsed["users"][0]["user"] == {"token": "tok"}


def test_token_file_lists_groups_in_one_quoted_field() -> None:
    users = {"a": TokenUser("admin", ("system:masters", "other")), "b": TokenUser("kcm")}
    assert (
        token_file_text({"a": "t1", "b": "t2"}, users)
        == 't1,admin,admin,"system:masters,other"\nt2,kcm,kcm\n'
    )


def test_pki_serving_certificates_carry_the_required_names(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    assert ensure_pki(pki) is True
    assert ensure_pki(pki) is False
    cert = x509.load_pem_x509_certificate(pki.cert("apiserver").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) >= {
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    }
    assert set(names.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("10.96.0.1"),
    }
    assert (pki.dir / "ca.key").stat().st_mode & 0o777 == 0o600
    assert set(yaml.safe_load(pki.tokens_json.read_text())) == set(TOKEN_USERS)


def test_up_refuses_in_one_sentence_without_mount_namespaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = Layout(repo=tmp_path, venv=tmp_path / ".venv")
    layout.bin_dir.mkdir(parents=True)
    for name in cluster.REQUIRED_BINARIES:
        (layout.bin_dir / name).write_text("#!/bin/sh\n")
        (layout.bin_dir / name).chmod(0o755)
    monkeypatch.setattr(cluster, "binary_version", lambda _: "v1.37.1")
    monkeypatch.setattr(cluster, "mount_namespaces_available", lambda: False)
    with pytest.raises(cluster.ClusterError) as refused:
        cluster.check_prerequisites(layout)
    message = str(refused.value)
    assert "mount namespace" in message and "root" in message
    assert message.count(". ") == 0 and message.endswith(".")


def test_up_names_the_missing_binaries(tmp_path: Path) -> None:
    with pytest.raises(cluster.ClusterError, match="missing etcd, kube-apiserver.*make bins"):
        cluster.check_prerequisites(Layout(repo=tmp_path, venv=tmp_path / ".venv"))


def test_up_refuses_an_apiserver_without_a_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = Layout(repo=tmp_path, venv=tmp_path / ".venv")
    layout.bin_dir.mkdir(parents=True)
    for name in cluster.REQUIRED_BINARIES:
        (layout.bin_dir / name).write_text("#!/bin/sh\necho Kubernetes\n")
        (layout.bin_dir / name).chmod(0o755)
    with pytest.raises(cluster.ClusterError, match="reports version ''"):
        cluster.check_prerequisites(layout)
