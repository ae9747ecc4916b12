"""Stored objects in tests: small real images made with Pillow, and what a storage folder holds."""

from __future__ import annotations

import io
import os
from pathlib import Path

from PIL import Image


def image_bytes(
    width: int = 8, height: int = 6, *, fmt: str = "PNG", color: tuple[int, int, int] = (200, 40, 90)
) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, format=fmt)
    return buffer.getvalue()


def noisy_png(width: int, height: int) -> bytes:
    """A PNG that does not compress (its size grows with its pixels)."""
    buffer = io.BytesIO()
    Image.frombytes("RGB", (width, height), os.urandom(width * height * 3)).save(buffer, format="PNG")
    return buffer.getvalue()


def stored_files(folder: Path) -> list[str]:
    """Every file under ``folder`` (relative paths), for "nothing was stored" checks."""
    if not folder.exists():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
