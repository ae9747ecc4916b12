"""mkdocs hooks: pages generated at build time, never kept in the tree.

- ``reference/openapi.md`` (and ``reference/openapi.json``): the API reference rendered from
  drf-spectacular's schema (``manage.py spectacular``), so the page cannot drift from the code.
- ``reference/command-line.md``: every ``manage.py`` command of the project's own apps with its
  ``--help``, read from the commands' parsers.
- ``adr/index.md``: every decision record under ``docs/adr/``, by number, with its title — a
  new ADR appears in the site without anyone editing a list.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("get", "post", "put", "patch", "delete")


def openapi_schema() -> dict[str, Any]:
    """The schema exactly as ``manage.py spectacular`` writes it. A throw-away var folder:
    settings create their secret files there, and a build must not write into the checkout."""
    with tempfile.TemporaryDirectory(prefix="onceguard-docs-") as tmp:
        out = Path(tmp) / "openapi.json"
        env = {**os.environ, "ONCEGUARD_VAR_DIR": tmp}
        env.pop("DATABASE_URL", None)
        subprocess.run(
            [sys.executable, "manage.py", "spectacular", "--format", "openapi-json", "--file", str(out)],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            timeout=300,
        )
        return json.loads(out.read_text())


# Run in a child process: Django is set up there, never in the process that builds the site.
COMMANDS_HELP = r"""
import json, sys
from pathlib import Path
import django
django.setup()
from django.core.management import get_commands, load_command_class
root = Path.cwd()
found = {}
for name, app in sorted(get_commands().items()):
    if not (root / app.split(".")[0]).is_dir() or name.startswith("_"):
        continue
    command = load_command_class(app, name)
    parser = command.create_parser("manage.py", name)
    found[name] = {"app": app, "help": parser.format_help()}
json.dump(found, sys.stdout)
"""


def commands_help() -> dict[str, dict[str, str]]:
    with tempfile.TemporaryDirectory(prefix="onceguard-docs-") as tmp:
        env = {**os.environ, "ONCEGUARD_VAR_DIR": tmp, "DJANGO_SETTINGS_MODULE": "config.settings", "COLUMNS": "100"}
        env.pop("DATABASE_URL", None)
        done = subprocess.run(
            [sys.executable, "-c", COMMANDS_HELP],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return json.loads(done.stdout)


def render_commands(commands: dict[str, dict[str, str]]) -> str:
    out = [
        "# Command line (every command)",
        "",
        "Every `manage.py` command of Onceguard's own apps, with its `--help` as the code declares it "
        "(generated at build time). Worked examples are in [Commands](commands.md).",
        "",
    ]
    for name, command in commands.items():
        out += [f"## `{name}`", "", f"From `{command['app']}`.", "", "```text", command["help"].rstrip(), "```", ""]
    return "\n".join(out) + "\n"


def cell(text: Any) -> str:
    """A value fit for one table cell: one line, pipes escaped."""
    return re.sub(r"\s+", " ", str(text or "")).replace("|", "\\|").strip()


def type_of(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#schema-{name.lower()})"
    for combined in ("allOf", "oneOf", "anyOf"):
        if combined in schema:
            return " or ".join(type_of(part) for part in schema[combined])
    kind = schema.get("type", "object" if "properties" in schema else "any")
    if kind == "array":
        return f"array of {type_of(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(f"`{value}`" for value in schema["enum"] if value not in ("", None)) or kind
    if schema.get("format"):
        return f"{kind} ({schema['format']})"
    return kind


def render_openapi(schema: dict[str, Any]) -> str:
    info = schema.get("info", {})
    out = [
        "# API reference (OpenAPI)",
        "",
        f"*{cell(info.get('description'))}* Version {info.get('version', '')}. Generated at build time "
        "from the running code's schema (`manage.py spectacular`); the same schema is served at "
        "`/api/schema/` and browsable at `/api/docs/`. Download it: [openapi.json](openapi.json). "
        "The guide to using these endpoints is the [API guide](api.md).",
        "",
        "Every endpoint takes a tenant's API key as `Authorization: Bearer <key>` (its scopes — `read`, "
        "`write`, `admin`, `audit`, `payload` — decide what it may do). Every refusal, whatever the status, "
        "is an RFC 9457 `application/problem+json` body with a stable `code`; the answers below list the "
        "successful shapes.",
        "",
    ]
    groups: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in schema.get("paths", {}).items():
        segments = [s for s in path.split("/") if s and s not in ("api", "v1")]
        group = segments[0] if segments else "root"
        for method in METHODS:
            if method in item:
                groups.setdefault(group, []).append((path, method, item[method]))
    for group, operations in groups.items():
        out += [f"## {group}", ""]
        for path, method, op in operations:
            out += [f"### `{method.upper()} {path}`", ""]
            if op.get("summary"):
                out += [f"**{cell(op['summary'])}**", ""]
            if op.get("description"):
                out += [op["description"].strip(), ""]
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | required | type | meaning |", "|---|---|---|---|---|"]
                for p in params:
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else ''} | "
                        f"{type_of(p.get('schema', {}))} | {cell(p.get('description'))} |"
                    )
                out.append("")
            body = op.get("requestBody", {}).get("content", {})
            if body:
                kinds = ", ".join(f"`{media}`: {type_of(c.get('schema', {}))}" for media, c in body.items())
                out += [f"Request body — {kinds}", ""]
            responses = op.get("responses", {})
            if responses:
                out += ["| answer | meaning | body |", "|---|---|---|"]
                for code, answer in responses.items():
                    content = answer.get("content", {})
                    shape = ", ".join(type_of(c.get("schema", {})) for c in content.values())
                    out.append(f"| `{code}` | {cell(answer.get('description'))} | {shape} |")
                out.append("")
    components = schema.get("components", {}).get("schemas", {})
    if components:
        out += ["## Schemas", ""]
        for name, component in components.items():
            out += [f"### {name} {{#schema-{name.lower()}}}", ""]
            if component.get("description"):
                out += [component["description"].strip(), ""]
            properties = component.get("properties", {})
            required = set(component.get("required", []))
            if properties:
                out += ["| field | type | required | meaning |", "|---|---|---|---|"]
                for field, spec in properties.items():
                    flags = "yes" if field in required else ""
                    if spec.get("readOnly"):
                        flags = (flags + " read-only").strip()
                    out.append(f"| `{field}` | {type_of(spec)} | {flags} | {cell(spec.get('description'))} |")
                out.append("")
            elif "enum" in component:
                out += [type_of(component), ""]
    return "\n".join(out) + "\n"


def render_adr_index(adr_dir: Path) -> str:
    out = [
        "# Architecture decision records",
        "",
        "A decision that shapes more than one file is written down here: its context, the decision, "
        "its consequences and the measurement behind it. Code comments cite these records.",
        "",
    ]
    for path in sorted(adr_dir.glob("[0-9][0-9][0-9][0-9]-*.md")):
        title = next(
            (line.lstrip("# ").strip() for line in path.read_text().splitlines() if line.startswith("# ")),
            path.stem,
        )
        out.append(f"- [{path.stem[:4]} — {title}]({path.name})")
    return "\n".join(out) + "\n"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    schema = openapi_schema()
    files.append(File.generated(config, "reference/openapi.md", content=render_openapi(schema)))
    files.append(File.generated(config, "reference/openapi.json", content=json.dumps(schema, indent=2)))
    files.append(File.generated(config, "reference/command-line.md", content=render_commands(commands_help())))
    adr_dir = Path(config["docs_dir"]) / "adr"
    files.append(File.generated(config, "adr/index.md", content=render_adr_index(adr_dir)))
    return files
