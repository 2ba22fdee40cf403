"""Which TCP addresses a set of processes listens on (from /proc, Linux only)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    pid: int
    address: str
    port: int

    @property
    def is_loopback(self) -> bool:
        return ipaddress.ip_address(self.address).is_loopback


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        fds = list(fd_dir.iterdir())
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _decode(hex_addr: str) -> tuple[str, int]:
    addr, port = hex_addr.split(":")
    raw = bytes.fromhex(addr)
    # /proc/net/tcp* store the address as 32-bit words in host (little-endian) order.
    swapped = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(swapped)), int(port, 16)


def listening_sockets(pids: Iterable[int]) -> list[Listener]:
    owners = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    out: list[Listener] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] != _LISTEN or cols[9] not in owners:
                continue
            address, port = _decode(cols[1])
            out.append(Listener(owners[cols[9]], address, port))
    return out
