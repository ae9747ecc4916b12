"""Restore fencing (ADR 0012): where the ledger's journal of possibly-performed keys lives,
how many nodes serve the ledger, and the one pairing the service refuses to start with."""

from __future__ import annotations

from collections.abc import Mapping

from ledger.platform.env.declare import BOOL, CHOICE, FLOAT, INT, PATH, STR, Setting, SettingError, _group, _s

FENCING: list[Setting] = _group(
    "Restore fencing",
    "settings.ONCEGUARD['{}']",
    _s(
        "FENCE_JOURNAL",
        CHOICE,
        "off",
        """Where the journal of keys whose effect may have happened is kept, outside the
        database: off, local (an append-only folder on this node) or redis (one journal for
        several nodes). Off: a restored backup is not detected.""",
        choices=("off", "local", "redis"),
    ),
    _s(
        "FENCE_JOURNAL_DIR",
        PATH,
        None,
        "The local journal's folder (never inside the database's backups).",
        default_text="var/fence-journal",
    ),
    _s(
        "FENCE_REDIS_URL",
        STR,
        "",
        "The Redis journal's URL (redis://host:port/db); required with FENCE_JOURNAL=redis.",
        secret=True,
    ),
    _s(
        "FENCE_JOURNAL_FSYNC",
        BOOL,
        False,
        """Local journal: fsync every entry before the database commit (survives a power cut
        of the node, at the price of a disk flush per sent or finished operation; off: the
        entry survives the process, not the machine).""",
    ),
    _s(
        "FENCE_JOURNAL_RETENTION_DAYS",
        INT,
        35,
        """How long journal entries are kept: at least as long as the oldest backup you could
        restore (point-in-time recovery window).""",
        minimum=1,
    ),
    _s(
        "FENCE_EPOCH_SECONDS",
        FLOAT,
        300.0,
        """How often the ledger advances its epoch (and a process re-reads it and its holds):
        the journal scanned after a restore is the stretch since the epoch of the backup.""",
        minimum=1,
    ),
    _s(
        "NODES",
        CHOICE,
        "single",
        """How many nodes serve this ledger: single, or multi (several hosts share the
        database). Multi-node refuses to start with FENCE_JOURNAL=local: one node's folder
        cannot see another's keys.""",
        choices=("single", "multi"),
        read_as="settings.ONCEGUARD['NODES']",
    ),
)


def fencing_refusal(read: object, environ: Mapping[str, str] | None = None) -> None:
    """SettingError for the combinations that cannot fence: several nodes on a local journal,
    or a Redis journal without its URL. ``read`` is ``env.read`` (this module sits below it)."""
    journal = read("FENCE_JOURNAL", environ)  # type: ignore[operator]
    if journal == "local" and read("NODES", environ) == "multi":  # type: ignore[operator]
        raise SettingError(
            "FENCE_JOURNAL=local with NODES=multi: a local journal cannot see the keys other nodes "
            "performed. Set FENCE_JOURNAL=redis (with FENCE_REDIS_URL) or FENCE_JOURNAL=off."
        )
    if journal == "redis" and not read("FENCE_REDIS_URL", environ):  # type: ignore[operator]
        raise SettingError("FENCE_JOURNAL=redis needs FENCE_REDIS_URL.")
