"""Settings for the bench's bare django-q2 baseline cluster: the project's settings with
every success kept (the bench reads start/stop times from them) and the cluster size and
poll interval the bench asks for. Used only by ``python -m bench.execute``."""

from __future__ import annotations

import os

from config.settings import *  # noqa: F403
from config.settings import Q_CLUSTER as _BASE_Q

Q_CLUSTER = {
    **_BASE_Q,
    "workers": int(os.environ.get("BENCH_Q_WORKERS", "2")),
    "poll": float(os.environ.get("BENCH_Q_POLL", "0.05")),
    "save_limit": 0,
    "log_level": "ERROR",
}
