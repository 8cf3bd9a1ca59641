"""Ports a test chooses for a server to bind later: drawn below the kernel's ephemeral range, where no outgoing
connection and no port-0 bind (`free_port()`) of the suite's parallel tests can take one between the probe and
the bind (fresh-clone CI runs lost a Redis Cluster bus port and a worker's metrics port so)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10000


def ephemeral_low() -> int:
    """The first port the kernel hands out for outgoing connections and port-0 binds."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def all_free(*ports: int) -> bool:
    """Whether each of `ports` can be bound on loopback now."""
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_below_ephemeral(offsets: tuple[int, ...] = (0,), tries: int = 200) -> int:
    """A port P below the ephemeral range with P + each of `offsets` free (and below it too)."""
    high = min(ephemeral_low(), 65536) - 1 - max(offsets)
    for _ in range(tries):
        port = random.randint(LOWEST, max(high, LOWEST + 1))
        if all_free(*(port + offset for offset in offsets)):
            return port
    raise RuntimeError(f"no free ports at offsets {offsets} below {high}")
