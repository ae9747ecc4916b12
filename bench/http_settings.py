"""Settings of the servers ``python -m bench`` starts: the project's settings, with the bench's
URLconf (the project's URLs plus the framework-floor view of bench/floor.py)."""

from __future__ import annotations

from config.settings import *  # noqa: F403

ROOT_URLCONF = "bench.floor"
