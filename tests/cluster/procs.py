"""Child processes of the local harness: start with a log file, stop by PID.

Every process is started in its own session so that a Ctrl-C in the terminal does not
tear components down in a random order; the harness stops them itself, newest first.
When ``tie_to_parent`` is set, the kernel also sends SIGKILL to the child if the
process that started it dies (Linux ``PR_SET_PDEATHSIG``, set by util-linux ``setpriv``
just before it execs the component; no ``preexec_fn``, which is unsafe once the test
process has threads), so a killed pytest run leaves nothing behind. SIGKILL, not SIGTERM:
a kube-apiserver whose etcd is already gone can hang in its graceful shutdown, and the
state is throw-away anyway.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now, as the kernel picks it (at random
    in its ephemeral range, so test workers, and other test runs on the same machine,
    almost never pick the same one between choosing it and binding it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:  # fallback without setpriv: runs between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


_SETPRIV = shutil.which("setpriv")


@dataclass(frozen=True)
class Proc:
    """A started component: its name, PID, the binary it runs and its log file."""

    name: str
    pid: int
    binary: str
    log: Path

    def alive(self) -> bool:
        """True while the PID still runs this component's binary (guards PID reuse)."""
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        state = stat.rsplit(")", 1)[-1].split()[0]
        if state == "Z":
            self._reap()
            return False
        argv0 = cmdline.split(b"\0", 1)[0].decode(errors="replace")
        # Right after start the PID may still be setpriv about to exec the component, or
        # in the middle of that exec (an empty cmdline).
        return argv0 in (self.binary, _SETPRIV, "")

    def _reap(self) -> None:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(self.pid, os.WNOHANG)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, wait up to ``grace_s``, then SIGKILL. Safe to call twice."""
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            self._reap()
            if not self.alive():
                return
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and self.alive():
            self._reap()
            time.sleep(0.05)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def rss_bytes(self) -> int:
        """Resident memory of the process, 0 when it is gone."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def to_json(self) -> dict[str, str | int]:
        return {"name": self.name, "pid": self.pid, "binary": self.binary, "log": str(self.log)}

    @classmethod
    def from_json(cls, data: dict[str, str | int]) -> Proc:
        return cls(str(data["name"]), int(data["pid"]), str(data["binary"]), Path(str(data["log"])))


def start(
    name: str,
    argv: Sequence[str],
    log_dir: Path,
    *,
    tie_to_parent: bool,
    env: dict[str, str] | None = None,
) -> Proc:
    """Start ``argv`` with stdout and stderr going to ``log_dir/<name>.log``."""
    log = log_dir / f"{name}.log"
    binary = str(argv[0])
    command = list(argv)
    preexec = None
    if tie_to_parent and _SETPRIV is not None:
        command = [_SETPRIV, "--pdeathsig", "KILL", "--", *command]
    elif tie_to_parent:
        preexec = _die_with_parent
    with log.open("ab") as out:
        popen = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,
            env=env,
        )
    # The Popen object is dropped on purpose: the harness tracks the PID, and reaps it
    # with waitpid in Proc.stop. Silence the "still running" ResourceWarning.
    popen.returncode = 0
    return Proc(name=name, pid=popen.pid, binary=binary, log=log)


def wait_for(
    what: str,
    check: Callable[[], bool],
    timeout_s: float,
    procs: Sequence[Proc] = (),
    interval_s: float = 0.2,
) -> None:
    """Poll ``check`` until true; fail early if one of ``procs`` died."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except Exception:  # a component that is still starting refuses connections
            pass
        for p in procs:
            if not p.alive():
                raise ComponentError(f"{p.name} exited while waiting for {what}", [p])
        if time.monotonic() > deadline:
            raise ComponentError(f"timed out after {timeout_s:.0f}s waiting for {what}", procs)
        time.sleep(interval_s)


class ComponentError(RuntimeError):
    """A harness component failed to start; the message carries its log tails."""

    def __init__(self, message: str, procs: Sequence[Proc] = ()) -> None:
        parts = [message]
        for p in procs:
            parts.append(f"--- {p.name} (pid {p.pid}, log {p.log}), last lines:\n{p.log_tail()}")
        super().__init__("\n".join(parts))
