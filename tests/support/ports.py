"""Free loopback ports for a process a test starts (a web server, redis, n8n, the demo
receivers), taken below the kernel's ephemeral range. A port picked with ``bind(0)`` comes
from that range, where any outgoing connection (to PostgreSQL, to a test server) may take it
in the moment between the pick and the child's own bind: a CI run lost the README walkthrough
that way (``DEMO_PORT_BASE + 3`` in use). Below the range only listeners compete."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_block(size: int, *, tries: int = 200) -> int:
    """The first of ``size`` consecutive loopback ports that are all free right now."""
    low = _ephemeral_low()
    lowest, highest = (20000, low - size) if low - size > 20000 else (1024, low - size)
    rng = random.Random()
    for _ in range(tries):
        base = rng.randrange(lowest, highest)
        held: list[socket.socket] = []
        try:
            for port in range(base, base + size):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"no {size} consecutive free loopback ports found below {low}")


def free_port() -> int:
    """One free loopback port for a child process to bind."""
    return free_port_block(1)
