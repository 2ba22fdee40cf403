"""Throw-away PKI for the local API server, made with the openssl command.

A CA, a serving certificate for 127.0.0.1, an admin client certificate in the
``system:masters`` group, and the service-account signing key pair. EC P-256 keys keep
generation well under a second.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVICE_CLUSTER_IP = "10.96.0.1"


@dataclass(frozen=True)
class Pki:
    ca_crt: Path
    ca_key: Path
    server_crt: Path
    server_key: Path
    admin_crt: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def _key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path)
    path.chmod(0o600)


def _signed(d: Path, name: str, subject: str, extensions: str, pki_ca: tuple[Path, Path]) -> None:
    key, csr, crt, ext = (d / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    _key(key)
    _openssl("req", "-new", "-key", key, "-subj", subject, "-out", csr)
    ext.write_text(extensions)
    ca_crt, ca_key = pki_ca
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial",
        "-days", "3650", "-sha256", "-extfile", ext, "-out", crt,
    )  # fmt: skip


def make_pki(d: Path) -> Pki:
    """Create all keys and certificates in directory ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = d / "ca.key", d / "ca.crt"
    _key(ca_key)
    _openssl(
        "req", "-x509", "-new", "-key", ca_key, "-subj", "/CN=prescaler-local-ca",
        "-days", "3650", "-sha256",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        "-out", ca_crt,
    )  # fmt: skip
    ca = (ca_crt, ca_key)
    _signed(
        d, "apiserver", "/CN=kube-apiserver",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        f"DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:{SERVICE_CLUSTER_IP}\n",
        ca,
    )  # fmt: skip
    _signed(
        d, "admin", "/O=system:masters/CN=prescaler-admin",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n",
        ca,
    )  # fmt: skip
    sa_key, sa_pub = d / "sa.key", d / "sa.pub"
    _key(sa_key)
    _openssl("pkey", "-in", sa_key, "-pubout", "-out", sa_pub)
    return Pki(
        ca_crt=ca_crt,
        ca_key=ca_key,
        server_crt=d / "apiserver.crt",
        server_key=d / "apiserver.key",
        admin_crt=d / "admin.crt",
        admin_key=d / "admin.key",
        sa_key=sa_key,
        sa_pub=sa_pub,
    )
