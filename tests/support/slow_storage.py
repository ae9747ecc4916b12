"""A storage backend that stops a process at a chosen instant: after an output passed its
checks and before it is published (``ledger.execution.outputs`` writes the objects storage, then the
row). Configured in a worker child process through ``OBJECT_STORAGE_BACKEND`` /
``OBJECT_STORAGE_OPTIONS`` like any Django storage, so the kill lands on the real code path."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.core.files.storage import FileSystemStorage


class PublishPausingStorage(FileSystemStorage):
    """Local files, except that each save first writes ``pause_marker`` (the name it is about to
    save) and then sleeps ``pause_seconds`` (bounded): the test kills the process meanwhile."""

    def __init__(self, *, pause_marker: str, pause_seconds: float = 60.0, **options: Any) -> None:
        super().__init__(**options)
        self.pause_marker = Path(pause_marker)
        self.pause_seconds = min(float(pause_seconds), 120.0)

    def _save(self, name: str, content: Any) -> str:
        self.pause_marker.write_text(name)
        time.sleep(self.pause_seconds)
        return super()._save(name, content)
