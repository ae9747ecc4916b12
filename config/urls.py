from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from observability.health import healthz, readyz
from observability.metrics import metrics_view

urlpatterns = [
    # Security keys as a second factor of local accounts (django-otp-webauthn's ceremonies,
    # review.staff.mfa, ADR 0014): before the console's catch-all.
    path("admin/sign-in/webauthn/", include("django_otp_webauthn.urls", namespace="otp_webauthn")),
    path("admin/", admin.site.urls),
    # Payload reveal (scope `payload`, reason, access log) — before the ledger's routes.
    path("api/v1/", include("review.privacy.urls")),
    path("api/v1/", include("ledger.urls")),
    path("api/v1/review/", include("review.urls")),
    path("api/v1/dlq/", include("dlq.urls")),
    path("api/v1/runs/", include("dlq.run_urls")),
    path("api/v1/subjects/", include("review.privacy.subject_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("metrics", metrics_view, name="metrics"),
    # Also answered by observability.health.HealthProbeMiddleware before any other middleware.
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    # Browsers ask for /favicon.ico whatever the page says; the console's icon is an SVG.
    path("favicon.ico", RedirectView.as_view(url=static("review/favicon.svg"), permanent=True)),
]

handler400 = "config.problems.handler400"
handler403 = "config.problems.handler403"
handler404 = "config.problems.handler404"
handler500 = "config.problems.handler500"
