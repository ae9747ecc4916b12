"""A web worker's start (config.warmup, called by config.wsgi): the console's templates are
compiled and the URL reverse dictionary built before the first request, not by it."""

from __future__ import annotations

from django.template import engines
from django.urls import get_resolver

from config.warmup import console_templates, warm_up


def test_the_console_templates_are_every_admin_template_of_django_the_project_and_its_apps() -> None:
    names = console_templates()
    # Django's admin, the project's override of it (templates/admin/) and an app's own page.
    assert {"admin/index.html", "admin/change_list.html", "admin/onceguard/index.html"} <= set(names)
    assert all(name.startswith("admin/") and name.endswith(".html") for name in names)


def test_warm_up_compiles_each_console_template_into_the_cached_loader() -> None:
    loader = engines["django"].engine.template_loaders[0]
    loader.reset()
    done = warm_up()
    names = console_templates()
    assert done == {"templates": len(names)}
    # The cached loader keys a template compiled by name with no skip by its name.
    assert set(names) <= set(loader.get_template_cache)
    assert get_resolver().reverse_dict  # built, as the first reverse() would have
