"""Every setting the service reads from the environment, declared once: name, type, default,
meaning — and the one function that reads them (:func:`read`).

``config.settings`` builds Django's settings from this table, and calls :func:`validate` first,
so a bad value stops the start with a message naming the variable and what it accepts,
instead of a ``ValueError`` deep in a request. The few values read per call rather than once
at start (the keys of ``ledger.platform.crypto``, ``ledger.rules.key_derivation`` and ``review.audit.accesslog``,
which an operator may rotate and the tests set per test) are read through :func:`read` too.
``docs/reference/settings.md`` is generated from this table (``manage.py settings_reference``).

Not here: a provider's credential named ``<ONCEGUARD_PROVIDER_SECRET_PREFIX><TENANT>_…``
(``ledger.providers.credentials``: its names are the operator's, not the service's), and the harness
variables of the tests, ``bench/``, ``soak`` and ``scripts/``.

It lives in the ledger, the floor every app may import (``.importlinter``), and imports only
the standard library and Django's exception: ``config.settings`` reads it before Django is
configured.

The table is declared by topic, one module each, and assembled here in the reference page's
order: :mod:`.core` (Django's core, the database, object storage, the task queue, ``make run``
and the web server), :mod:`.security` (sessions, keys, the access log, retention),
:mod:`.sign_in` (single sign-on and the second factor of the console's local accounts),
:mod:`.execution` (the ledger's own knobs), :mod:`.observability` (logging, health and
metrics) and :mod:`.dlq_alerts`; :mod:`.declare` says how a setting is declared and how each
kind of value is parsed. Callers import this package only (``from ledger.platform import env``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from ledger.platform.env import core, dlq_alerts, execution, fencing, observability, security, sign_in
from ledger.platform.env.declare import (  # noqa: F401 -- the table's public names, used as env.<name>
    BOOL,
    CHOICE,
    CIDRS,
    FLOAT,
    INT,
    JSON_OBJECT,
    LIST,
    PATH,
    REGEX_LINES,
    STR,
    Setting,
    SettingError,
)

# The reference page's sections, in this order.
SETTINGS: tuple[Setting, ...] = (
    *core.CORE,
    *core.DATABASE,
    *core.OBJECT_STORAGE,
    *security.SECURITY,
    *sign_in.CONSOLE_SIGN_IN,
    *execution.LEDGER,
    *fencing.FENCING,
    *security.ACCESS_LOG,
    *security.RETENTION,
    *core.TASK_QUEUE,
    *observability.LOGGING,
    *observability.HEALTH_AND_METRICS,
    *observability.TRACES,
    *dlq_alerts.DLQ,
    *dlq_alerts.ALERTS,
    *core.RUN,
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def raw(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The variable's text as set (a former name's when it is unset); "" when neither is."""
    environ = os.environ if environ is None else environ
    setting = BY_NAME[name]
    value = environ.get(name)
    if not value:
        for former in setting.former_names:
            if environ.get(former):
                return environ[former]
    return value or ""


def read(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The declared setting ``name`` from ``environ`` (the process's environment by default):
    its default when unset or empty, else its value parsed and checked; SettingError
    (ImproperlyConfigured) with a message naming the variable when it is not valid. Cheap
    enough to call per use (the key rings call it on every seal)."""
    setting = BY_NAME[name]
    environ = os.environ if environ is None else environ
    value = environ.get(name)
    if not value:
        if value == "" and setting.blank_is_value:
            return [] if setting.kind in (LIST, CIDRS, REGEX_LINES) else ""
        if not setting.former_names:
            return setting.default
        value = next((environ[f] for f in setting.former_names if environ.get(f)), "")
        if not value:
            return setting.default
    return setting.parse(value)


def validate(environ: Mapping[str, str] | None = None, names: Iterable[str] | None = None) -> None:
    """Read every declared setting once; one SettingError listing each bad variable."""
    problems = []
    for name in BY_NAME if names is None else names:
        try:
            read(name, environ)
        except SettingError as exc:
            problems.append(str(exc))
    if not problems and names is None:
        try:
            fencing.fencing_refusal(read, environ)
        except SettingError as exc:
            problems.append(str(exc))
    if problems:
        raise SettingError("Bad settings in the environment:\n  " + "\n  ".join(problems))


def reference_markdown() -> str:
    """docs/reference/settings.md: the table, one section per group."""
    out = [
        "# Settings reference",
        "",
        "<!-- Generated from ledger/platform/env/ by `python manage.py settings_reference`; do not edit. -->",
        "",
        "Every setting the service reads from the environment. An unset or empty variable takes",
        "its default; a value the setting does not accept stops the start with a message naming",
        "the variable. Secrets are marked; keep them out of files under version control",
        "(docs/secrets.md).",
        "",
    ]
    groups: dict[str, list[Setting]] = {}
    for s in SETTINGS:
        groups.setdefault(s.group, []).append(s)
    for group, settings in groups.items():
        out += [f"## {group}", "", "| Variable | Accepts | Default | Meaning | Read as |", "|---|---|---|---|---|"]
        for s in settings:
            meaning = s.meaning
            if s.secret:
                meaning += " **Secret.**"
            if s.former_names:
                meaning += " Former name: " + ", ".join(f"`{n}`" for n in s.former_names) + "."
            default = s.default_shown()
            if not s.default_text and default not in ("(unset)", "(empty)"):
                default = f"`{default}`"
            cells = [f"`{s.name}`", s.accepts(), default, meaning, s.read_as]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)
