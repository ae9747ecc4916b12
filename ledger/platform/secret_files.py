"""Files that hold secrets (var/secret_key, var/encryption.key, var/credentials.txt, the demo's
passwords) are born with mode 600 and complete: written to a private temporary file in the
same folder (``mkstemp``: 0600, O_EXCL), flushed, then linked or renamed into place. Nobody
ever sees one half-written or with a wider mode — not even for the moment between a create
and a ``chmod`` — and of two processes creating the same file at once, one wins and the other
reads the winner's.

Imports nothing but the standard library: the settings module uses it before Django is set up.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_secret_file(path: Path, text: str, *, replace: bool = False) -> bool:
    """Create ``path`` holding ``text``, mode 600, atomically. An existing file is kept
    (False) unless ``replace``, when it is swapped for the new one in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_or_create_secret_file(path: Path, make: str) -> str:
    """The stripped content of ``path``, created holding ``make`` (mode 600) if missing."""
    if not path.exists():
        write_secret_file(path, make)
    return path.read_text().strip()
