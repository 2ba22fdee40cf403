"""Real gateways in front of a local engine, configured as ``docs/degradation.md`` shows.

NGINX (Debian's package, ``make nginx-bin``) and Caddy (built from its Go module by
``make cluster-bin``) run as child processes of the test, each with its own prefix and
configuration in a directory of its own. Their configurations are the fenced blocks of
the docs (```` ```nginx ```` and ```` ```caddy ````), with only the addresses changed: the
check's Service, the engine's Service and the listening port become loopback ports, and
the pool becomes the test's. What the docs show is what runs.

Usage::

    with Gateway.nginx(tmp, admit_port=..., engine_port=..., pool="ns/chat") as nginx:
        nginx.url  # http://127.0.0.1:<port>
"""

from __future__ import annotations

import os
import re
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from cluster import procs
from cluster.paths import PROJECT_ROOT, bin_dir

DOC = PROJECT_ROOT / "docs" / "degradation.md"
ADMISSION = "prescaler-admission.prescaler.svc:8081"
ENGINE = "llama-chat.llm.svc:8000"
POOL = "llm/llama-chat"


def doc_block(lang: str, doc: Path = DOC) -> str:
    """The one fenced block of ``lang`` in ``doc``."""
    blocks = re.findall(rf"^```{re.escape(lang)}\n(.*?)^```$", doc.read_text(), re.M | re.S)
    if len(blocks) != 1:
        raise AssertionError(f"{doc.name} has {len(blocks)} ```{lang} blocks, not one")
    return str(blocks[0])


def _localized(text: str, *, admit_port: int, engine_port: int, pool: str) -> str:
    for old, new in (
        (ADMISSION, f"127.0.0.1:{admit_port}"),
        (ENGINE, f"127.0.0.1:{engine_port}"),
        (POOL, pool),
    ):
        if old not in text:
            raise AssertionError(f"the documented configuration no longer names {old}")
        text = text.replace(old, new)
    return text


def nginx_binary() -> str:
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.access(found, os.X_OK):
        raise RuntimeError("nginx is not installed: run `make nginx-bin`")
    return found


def caddy_binary() -> str:
    found = bin_dir() / "caddy"
    if not os.access(found, os.X_OK):
        raise RuntimeError("caddy is not built: run `make cluster-bin`")
    return str(found)


class Gateway:
    """A gateway process; :attr:`url` is where it listens."""

    def __init__(self, name: str, proc: procs.Proc, port: int) -> None:
        self.name = name
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    @classmethod
    def nginx(
        cls,
        directory: Path,
        *,
        admit_port: int,
        engine_port: int,
        pool: str,
        server: str | None = None,
        tie_to_parent: bool = True,
    ) -> Gateway:
        """NGINX serving the docs' ``server`` block (or ``server``, for a benchmark's
        baseline), with one worker, no access log, and its files in ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (directory / "tmp" / sub).mkdir(parents=True, exist_ok=True)
        port = procs.free_port()
        block = server if server is not None else doc_block("nginx")
        block = _localized(block, admit_port=admit_port, engine_port=engine_port, pool=pool)
        block = block.replace("listen 8080;", f"listen 127.0.0.1:{port};")
        tmp = directory / "tmp"
        # As root, nginx would run its worker as nobody, who cannot enter the test's
        # private temporary directory.
        user = "user root;\n" if os.geteuid() == 0 else ""
        (directory / "nginx.conf").write_text(
            f"""{user}worker_processes 1;
pid {directory}/nginx.pid;
error_log {directory}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    default_type text/plain;
    keepalive_requests 1000000;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
{block}
}}
"""
        )
        argv = [
            nginx_binary(),
            "-p",
            str(directory),
            "-c",
            str(directory / "nginx.conf"),
            "-e",
            str(directory / "error.log"),
            "-g",
            "daemon off;",
        ]
        proc = procs.start("nginx", argv, directory, tie_to_parent=tie_to_parent)
        return cls("nginx", proc, port).wait_listening()

    @classmethod
    def caddy(
        cls,
        directory: Path,
        *,
        admit_port: int,
        engine_port: int,
        pool: str,
        tie_to_parent: bool = True,
    ) -> Gateway:
        """Caddy serving the docs' Caddyfile, without its admin endpoint or automatic
        HTTPS, its state in ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        port = procs.free_port()
        site = _localized(doc_block("caddy"), admit_port=admit_port, engine_port=engine_port,
                          pool=pool)  # fmt: skip
        if not site.startswith(":8080 {"):
            raise AssertionError("the documented Caddyfile no longer listens on :8080")
        site = f"http://127.0.0.1:{port} {{" + site.removeprefix(":8080 {")
        caddyfile = directory / "Caddyfile"
        caddyfile.write_text("{\n\tadmin off\n\tpersist_config off\n}\n\n" + site)
        env = {
            "HOME": str(directory),
            "XDG_DATA_HOME": str(directory / "data"),
            "XDG_CONFIG_HOME": str(directory / "config"),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        }
        argv = [caddy_binary(), "run", "--config", str(caddyfile), "--adapter", "caddyfile"]
        proc = procs.start("caddy", argv, directory, tie_to_parent=tie_to_parent, env=env)
        return cls("caddy", proc, port).wait_listening()

    def wait_listening(self, timeout_s: float = 60.0) -> Gateway:
        def up() -> bool:
            try:
                with urllib.request.urlopen(f"{self.url}/healthz-probe", timeout=5):
                    return True
            except urllib.error.HTTPError:
                return True  # an answer, whatever it is
            return False

        try:
            procs.wait_for(f"{self.name} to listen", up, timeout_s, [self.proc])
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.proc.stop()

    def __enter__(self) -> Gateway:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
