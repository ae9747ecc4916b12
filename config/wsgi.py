import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()

# Each worker imports this module once: the work Django defers to a process's first request
# is done here instead (config.warmup).
from config.warmup import warm_up  # noqa: E402 — after the application: Django must be set up

warm_up()
