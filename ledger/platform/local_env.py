"""The demo's local configuration: ``var/local.env``, written by ``make run``, read by every
``manage.py`` process started from the same checkout — a README block pasted into a second
terminal sees the demo's loopback allowance, port base and metrics token file without
inheriting ``make run``'s environment.

The file is plain ``KEY=VALUE`` lines (``#`` comments, blank lines ignored) and may set only
the names in :data:`KEYS`. It is read only under the demo settings (:func:`applies`): the
embedded mode — no ``DATABASE_URL`` and ``DEBUG`` not explicitly off. A production deployment
(which sets both, see config.settings) from the same checkout never reads it, so a file left
behind under ``var/`` cannot widen its outbound policy. A real environment variable always
wins over the file.

Standard library only: config.settings imports it before anything else is configured (it
lives in the ledger so `make run`, a ledger command, can write what settings reads).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path

FILE_NAME = "local.env"

# What the file may set (and what `make run` writes). Anything else in it is ignored.
KEYS: dict[str, str] = {
    "DEMO_PORT_BASE": "first port of the demo receivers (mocks and relays on base … base + 5)",
    "DEMO_OUTBOUND_ALLOW": "the demo receivers' loopback ports, allowed besides OUTBOUND_ALLOW",
    "METRICS_TOKEN_FILE": "the file holding the demo's /metrics bearer token",
    "REQUEST_LOG_SLOW_MS": "make run logs a request only when it fails or takes at least this long",
    "CONSOLE_MFA_EXEMPT_USERS": "the demo admin, who signs in with its password alone (ADR 0014)",
}

_OFF = {"0", "false", "no", "off"}


def applies(environ: Mapping[str, str]) -> bool:
    """Whether these are the demo settings: the embedded database and DEBUG not turned off.
    Production sets DATABASE_URL and DEBUG=0 (config.settings), either of which says no."""
    if environ.get("DATABASE_URL"):
        return False
    return (environ.get("DEBUG") or "").strip().lower() not in _OFF


def in_test_suite() -> bool:
    """The test suite never reads the file: it sets its own outbound rules, and a demo
    running from the same checkout must not change what the tests see."""
    return "pytest" in sys.modules


def parse(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines → the known keys' values (surrounding quotes and blanks stripped)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, value = line.split("=", 1)
        name, value = name.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if name in KEYS:
            values[name] = value
    return values


def load(var_dir: Path, environ: MutableMapping[str, str] | None = None) -> frozenset[str]:
    """Put the file's values into ``environ`` (``os.environ``) where it has none; returns the
    names that came from the file (``make run`` itself recomputes those rather than reuse a
    previous run's)."""
    environ = os.environ if environ is None else environ
    path = var_dir / FILE_NAME
    if not applies(environ) or in_test_suite() or not path.is_file():
        return frozenset()
    applied = set()
    for name, value in parse(path.read_text()).items():
        if name not in environ:
            environ[name] = value
            applied.add(name)
    return frozenset(applied)


def render(values: Mapping[str, str]) -> str:
    """The file's text for ``values`` (known keys only), each with what it means."""
    lines = [
        "# Written by `make run` (manage.py run_all) at every start; read by every manage.py",
        "# command, server and worker of this checkout, only under the demo settings (no",
        "# DATABASE_URL, DEBUG not off). Real environment variables win. See ledger/platform/local_env.py.",
    ]
    for name, value in values.items():
        if name in KEYS and "\n" not in value:
            lines += [f"# {KEYS[name]}", f"{name}={value}"]
    return "\n".join(lines) + "\n"
