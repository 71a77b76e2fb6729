"""The local cluster's certificate authority, serving certificates, keys and tokens.

Generated once into `.cache/cluster/pki/` and kept across `down`/`up`, so kubeconfigs and
the tokens inside running pods stay valid. ECDSA P-256 keys: instant to generate, and
every component (Go, Python, the JVM) accepts them.
"""

from __future__ import annotations

import csv
import datetime
import io
import ipaddress
import json
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from localcluster.layout import KUBERNETES_SERVICE_IP, LOOPBACK, NODE_NAME

VALIDITY = datetime.timedelta(days=3650)

APISERVER_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class TokenUser:
    """One line of the apiserver's static token file."""

    name: str
    groups: tuple[str, ...] = ()


# Who authenticates with a static token. The controller manager's user is the one the
# bootstrap RBAC policy binds to system:kube-controller-manager.
TOKEN_USERS: Mapping[str, TokenUser] = {
    "admin": TokenUser("localcluster-admin", ("system:masters",)),
    "kube-controller-manager": TokenUser("system:kube-controller-manager"),
    # The node agent binds pods, writes their status and requests their tokens: it is
    # kubelet and scheduler at once, so it gets full rights rather than system:nodes.
    "node-agent": TokenUser("localcluster-node-agent", ("system:masters",)),
}


@dataclass(frozen=True)
class CertSpec:
    """What one leaf certificate says about its holder."""

    common_name: str
    organizations: tuple[str, ...] = ()
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    server: bool = False
    client: bool = False


# File stem -> certificate. All signed by the cluster CA.
LEAF_CERTS: Mapping[str, CertSpec] = {
    "apiserver": CertSpec(
        "kube-apiserver",
        dns_names=APISERVER_DNS_NAMES,
        ip_addresses=(LOOPBACK, KUBERNETES_SERVICE_IP),
        server=True,
    ),
    # The apiserver presents it to the node agent's kubelet endpoint (kubectl logs).
    "apiserver-kubelet-client": CertSpec(
        "kube-apiserver-kubelet-client", organizations=("system:masters",), client=True
    ),
    "kubelet": CertSpec(
        f"system:node:{NODE_NAME}",
        organizations=("system:nodes",),
        dns_names=(NODE_NAME, "localhost"),
        ip_addresses=(LOOPBACK,),
        server=True,
    ),
    "controller-manager": CertSpec(
        "kube-controller-manager", dns_names=("localhost",), ip_addresses=(LOOPBACK,), server=True
    ),
}


@dataclass(frozen=True)
class Pki:
    """Paths of the generated material."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    def cert(self, stem: str) -> Path:
        return self.dir / f"{stem}.crt"

    def key(self, stem: str) -> Path:
        return self.dir / f"{stem}.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    @property
    def token_file(self) -> Path:
        """The apiserver's --token-auth-file (CSV)."""
        return self.dir / "tokens.csv"

    @property
    def tokens_json(self) -> Path:
        return self.dir / "tokens.json"

    def token(self, who: str) -> str:
        tokens: dict[str, str] = json.loads(self.tokens_json.read_text())
        return tokens[who]

    def is_complete(self) -> bool:
        paths = [self.ca_cert, self.ca_key, self.sa_key, self.sa_pub, self.token_file, self.tokens_json]
        paths += [self.cert(s) for s in LEAF_CERTS] + [self.key(s) for s in LEAF_CERTS]
        return all(p.exists() for p in paths)


def ensure_pki(pki: Pki) -> bool:
    """Generates whatever is missing; returns True if anything was generated.

    A missing CA invalidates every leaf, so it regenerates everything then.
    """
    if pki.is_complete():
        return False
    pki.dir.mkdir(parents=True, exist_ok=True)
    os.chmod(pki.dir, 0o700)
    ca_key = _new_key()
    ca_cert = _ca_certificate(ca_key)
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, ca_cert)
    for stem, spec in LEAF_CERTS.items():
        key = _new_key()
        _write_key(pki.key(stem), key)
        _write_cert(pki.cert(stem), _leaf_certificate(spec, key, ca_cert, ca_key))
    sa_key = _new_key()
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    tokens = {who: secrets.token_urlsafe(32) for who in TOKEN_USERS}
    _write_private(pki.tokens_json, json.dumps(tokens, indent=2).encode())
    _write_private(pki.token_file, token_file_text(tokens, TOKEN_USERS).encode())
    return True


def token_file_text(tokens: Mapping[str, str], users: Mapping[str, TokenUser]) -> str:
    """Renders the static token CSV: token,user,uid[,"group1,group2"]."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for who, token in tokens.items():
        user = users[who]
        row = [token, user.name, user.name]
        if user.groups:
            row.append(",".join(user.groups))
        writer.writerow(row)
    return out.getvalue()


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str, organizations: Iterable[str] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    # Back-dated an hour so that a clock step does not make a fresh cert "not yet valid".
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + VALIDITY)


def _key_usage(signs_certificates: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def _ca_certificate(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = _name("localcluster-ca")
    builder = _validity(
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
    )
    builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    builder = builder.add_extension(_key_usage(signs_certificates=True), critical=True)
    builder = builder.add_extension(
        x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
    )
    return builder.sign(key, hashes.SHA256())


def _leaf_certificate(
    spec: CertSpec,
    key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
) -> x509.Certificate:
    builder = _validity(
        x509.CertificateBuilder()
        .subject_name(_name(spec.common_name, spec.organizations))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
    )
    builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    builder = builder.add_extension(_key_usage(signs_certificates=False), critical=True)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] * spec.server + [ExtendedKeyUsageOID.CLIENT_AUTH] * spec.client
    builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    builder = builder.add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
    )
    alt_names: list[x509.GeneralName] = [x509.DNSName(d) for d in spec.dns_names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in spec.ip_addresses]
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    _write_private(
        path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        ),
    )


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
