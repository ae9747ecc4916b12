"""The admin app with the console's site as the default site (see review.console.site)."""

from django.contrib.admin.apps import AdminConfig


class OnceguardAdminConfig(AdminConfig):
    default_site = "review.console.site.OnceguardAdminSite"
