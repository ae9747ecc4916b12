"""The admin app with the console's site as the default site (see review.console)."""

from django.contrib.admin.apps import AdminConfig


class OnceguardAdminConfig(AdminConfig):
    default_site = "review.console.OnceguardAdminSite"
