"""Throw-away PKI for the local API server, made with the openssl command.

A CA, a serving certificate for 127.0.0.1, an admin client certificate in the
``system:masters`` group, the service-account signing key pair, and the aggregation
layer's front proxy: its own CA and the client certificate the API server presents to
aggregated API servers (such as KEDA's metrics API server). EC P-256 keys keep generation
well under a second.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVICE_CLUSTER_IP = "10.96.0.1"
FRONT_PROXY_CLIENT = "front-proxy-client"
"""The front proxy's client certificate CN (the API server's --requestheader-allowed-names)."""


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
    front_proxy_ca_crt: Path
    front_proxy_client_crt: Path
    front_proxy_client_key: Path


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


def _ca(d: Path, name: str, common_name: str) -> tuple[Path, Path]:
    crt, key = d / f"{name}.crt", d / f"{name}.key"
    _key(key)
    _openssl(
        "req", "-x509", "-new", "-key", key, "-subj", f"/CN={common_name}",
        "-days", "3650", "-sha256",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        "-out", crt,
    )  # fmt: skip
    return crt, key


def make_pki(d: Path) -> Pki:
    """Create all keys and certificates in directory ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca(d, "ca", "prescaler-local-ca")
    ca_crt, ca_key = ca
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
    front_proxy_ca = _ca(d, "front-proxy-ca", "prescaler-front-proxy-ca")
    _signed(
        d, FRONT_PROXY_CLIENT, f"/CN={FRONT_PROXY_CLIENT}",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n",
        front_proxy_ca,
    )  # fmt: skip
    return Pki(
        ca_crt=ca_crt,
        ca_key=ca_key,
        server_crt=d / "apiserver.crt",
        server_key=d / "apiserver.key",
        admin_crt=d / "admin.crt",
        admin_key=d / "admin.key",
        sa_key=sa_key,
        sa_pub=sa_pub,
        front_proxy_ca_crt=front_proxy_ca[0],
        front_proxy_client_crt=d / f"{FRONT_PROXY_CLIENT}.crt",
        front_proxy_client_key=d / f"{FRONT_PROXY_CLIENT}.key",
    )


def make_service_certs(d: Path, common_name: str, dns_names: list[str]) -> Path:
    """A CA of its own and one certificate signed by it, for both ends of a service's
    mutual TLS (server and client use), valid for 127.0.0.1, localhost and ``dns_names``.
    Written as ``ca.crt``, ``tls.crt`` and ``tls.key`` in ``d`` (the layout of a
    kubernetes.io/tls Secret with its CA, as KEDA mounts it); returns ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca(d, "ca", f"{common_name}-ca")
    sans = ",".join(["IP:127.0.0.1", "DNS:localhost", *(f"DNS:{n}" for n in dns_names)])
    _signed(
        d, "tls", f"/CN={common_name}",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName={sans}\n",
        ca,
    )  # fmt: skip
    return d
