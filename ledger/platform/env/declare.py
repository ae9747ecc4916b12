"""How a setting is declared (:class:`Setting`: name, kind, default, meaning) and how each kind
of value is parsed and checked; the topic modules beside it declare the table with :func:`_s`
and :func:`_group`."""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

# Kinds of value, and what a reader is told each accepts.
STR, INT, FLOAT, BOOL, LIST, CIDRS, REGEX_LINES, JSON_OBJECT, CHOICE, PATH = (
    "str",
    "int",
    "float",
    "bool",
    "list",
    "cidrs",
    "regex lines",
    "JSON object",
    "choice",
    "path",
)
_ACCEPTS = {
    STR: "text",
    INT: "a whole number (e.g. 60)",
    FLOAT: "a number (e.g. 0.5)",
    BOOL: "1/0, true/false, yes/no or on/off",
    LIST: "comma-separated values",
    CIDRS: "comma-separated IP addresses or networks (e.g. 10.0.0.0/8,192.168.1.10)",
    REGEX_LINES: "regular expressions, one per line",
    JSON_OBJECT: 'a JSON object (e.g. {"bucket_name": "x"})',
    PATH: "a file or folder path",
}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class SettingError(ImproperlyConfigured):
    """A variable's value is not one its setting accepts (the message says which and why)."""


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str
    # None: derived at start (``default_text`` says how), or unset means "off".
    default: Any
    meaning: str
    group: str = ""
    # Where the service reads it (a Django setting, a module).
    read_as: str = ""
    minimum: float | None = None
    choices: tuple[str, ...] = ()
    # Letters and digits only, e.g. a region code: a regular expression the stripped value must match.
    pattern: str = ""
    # A key or a password: its value is never shown in a message or in the reference.
    secret: bool = False
    # An earlier name still read when the variable itself is unset.
    former_names: tuple[str, ...] = ()
    # Set to the empty string: the empty value (an empty list, no text), not the default.
    blank_is_value: bool = False
    default_text: str = ""

    def accepts(self) -> str:
        if self.kind == CHOICE:
            text = "one of " + ", ".join(self.choices)
        else:
            text = _ACCEPTS[self.kind]
        if self.minimum is not None:
            text += f", at least {self.minimum:g}"
        if self.pattern:
            text += f", matching {self.pattern}"
        return text

    def default_shown(self) -> str:
        if self.default_text:
            return self.default_text
        if self.default is None or self.default == "":
            return "(unset)"
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        if isinstance(self.default, list | tuple):
            return ",".join(str(v) for v in self.default) or "(empty)"
        if isinstance(self.default, dict):
            return json.dumps(self.default) if self.default else "{}"
        return str(self.default)

    def parse(self, raw: str) -> Any:
        """``raw`` (the variable's text, not empty) as this setting's value; SettingError if it
        is not one it accepts."""
        text = raw.strip()
        try:
            value = _PARSERS[self.kind](self, raw, text)
        except (ValueError, TypeError, re.error) as exc:
            raise self._error(raw, str(exc)) from None
        if self.minimum is not None and value < self.minimum:
            raise self._error(raw, f"below {self.minimum:g}")
        if self.pattern and text and not re.fullmatch(self.pattern, text):
            raise self._error(raw, "does not match")
        return value

    def _error(self, raw: str, why: str) -> SettingError:
        shown = "(hidden)" if self.secret else repr(raw)
        return SettingError(f"{self.name}={shown} is not valid ({why}): it accepts {self.accepts()}.")


def _int(s: Setting, raw: str, text: str) -> int:
    if not re.fullmatch(r"[+-]?[0-9][0-9_]*", text):
        raise ValueError("not a whole number")
    return int(text)


def _float(s: Setting, raw: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("not a finite number")
    return value


def _bool(s: Setting, raw: str, text: str) -> bool:
    word = text.lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError("not a yes or a no")


def _list(s: Setting, raw: str, text: str) -> list[str]:
    return [part.strip() for part in raw.split(",") if part.strip()]


def _cidrs(s: Setting, raw: str, text: str) -> list[str]:
    parts = _list(s, raw, text)
    for part in parts:
        ipaddress.ip_network(part, strict=False)
    return parts


def _regex_lines(s: Setting, raw: str, text: str) -> list[str]:
    lines = [line.strip() for line in raw.splitlines() if line.strip()]
    for line in lines:
        re.compile(line)
    return lines


def _json_object(s: Setting, raw: str, text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return value


def _choice(s: Setting, raw: str, text: str) -> str:
    if text in s.choices:
        return text
    folded = {c.lower(): c for c in s.choices}
    if text.lower() in folded:
        return folded[text.lower()]
    raise ValueError("not one of the choices")


def _str(s: Setting, raw: str, text: str) -> str:
    return raw


_PARSERS = {
    STR: _str,
    PATH: _str,
    INT: _int,
    FLOAT: _float,
    BOOL: _bool,
    LIST: _list,
    CIDRS: _cidrs,
    REGEX_LINES: _regex_lines,
    JSON_OBJECT: _json_object,
    CHOICE: _choice,
}


def _s(name: str, kind: str, default: Any, meaning: str, **kw: Any) -> Setting:
    return Setting(name, kind, default, " ".join(meaning.split()), **kw)


def _group(group: str, read_as: str, *settings: Setting) -> list[Setting]:
    """The settings of one part of the service; ``read_as`` with ``{}`` is filled with the
    setting's key (its name unless the setting says otherwise)."""
    out = []
    for s in settings:
        target = s.read_as or (read_as.format(s.name) if read_as else "")
        out.append(Setting(**{**s.__dict__, "group": group, "read_as": target}))
    return out
