"""What a web worker does once, before its first request (config.wsgi): per-process work that
Django otherwise leaves to whichever request needs it first.

- The URLconf's reverse dictionary and the console's namespace: built on the process's first
  ``reverse()`` (every console page links), ~80 ms of CPU.
- The console's templates (every ``admin/`` template of the project and its apps), compiled
  into the cached template loader: ~160 ms of CPU for the 75, otherwise paid by each page's
  first render.

At ten million rows the console's dashboard took 634 ms at p95 against a median of 215 ms:
the p95 was the process's first call (bench/results/scale-10M.md). With four workers a node,
each restart or deploy handed that first call to four users. Nothing here reads the
database: a worker starts the same whether it is up or not.
"""

from __future__ import annotations

from pathlib import Path

# The console's templates: Django's admin and the project's and apps' overrides of it.
CONSOLE_TEMPLATES = "admin"


def console_templates() -> list[str]:
    """The names of the console's templates in every template folder (the project's DIRS and,
    as APP_DIRS reads them, each installed app's ``templates``)."""
    from django.apps import apps
    from django.conf import settings

    folders = [Path(d) for t in settings.TEMPLATES for d in t.get("DIRS", [])]
    folders += [Path(a.path) / "templates" for a in apps.get_app_configs()]
    return sorted(
        {f.relative_to(folder).as_posix() for folder in folders for f in (folder / CONSOLE_TEMPLATES).rglob("*.html")}
    )


def warm_up() -> dict[str, int]:
    """Build the URL reverse dictionary and compile the console's templates; how many. A
    template that does not compile raises here, at the worker's start, not on a user's page."""
    from django.template.loader import get_template
    from django.urls import reverse

    reverse("admin:index")
    templates = console_templates()
    for name in templates:
        get_template(name)
    return {"templates": len(templates)}
