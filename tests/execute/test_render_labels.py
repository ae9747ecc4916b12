"""A render job's preset version and aspect class (ADR 0016) on every line its attempt writes,
on the provider-call histogram's labels — capped like the provider slugs — and on the evidence
its failed attempt leaves, against a real loopback render API."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from ledger.models import AttemptEvidence, Operation, OperationStatus
from ledger.platform import telemetry
from tests.execute.support import make_due, run_due
from tests.execute.test_intents import INTENT, renders, submit  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db

HISTOGRAM = "onceguard_provider_call_duration_seconds_count"


def calls(**labels: str) -> float:
    return REGISTRY.get_sample_value(HISTOGRAM, labels) or 0.0


@pytest.mark.usefixtures("renders")
def test_every_line_of_a_render_attempt_and_its_histogram_label_name_the_preset_and_aspect(api, log_lines):
    before = calls(provider="renders", outcome="succeeded", revision="1", preset_version="3", aspect_class="portrait")
    assert submit(api, INTENT, key="render-7:v1").status_code == 202

    run_due()

    assert Operation.objects.get().status == OperationStatus.SUCCEEDED
    after = calls(provider="renders", outcome="succeeded", revision="1", preset_version="3", aspect_class="portrait")
    assert after == before + 1
    attempt_lines = [line for line in log_lines if "key=render-7:v1" in line]
    assert any(" execute_attempt " in line for line in attempt_lines), attempt_lines
    for line in attempt_lines:
        assert "preset_version=3" in line and "aspect_class=portrait" in line, line


@pytest.mark.usefixtures("renders")
def test_a_failed_render_leaves_evidence_with_its_labels_and_its_revision(api, render_api, log_lines):
    render_api.statuses = [408, 400]
    assert submit(api, INTENT, key="render-8:v1").status_code == 202

    run_due()
    make_due(Operation.objects.get().pk)
    run_due()

    op = Operation.objects.get()
    assert op.status == OperationStatus.FAILED
    rows = list(AttemptEvidence.objects.order_by("attempt_number"))
    assert [(r.attempt_number, r.error_class, r.response_status) for r in rows] == [
        (1, "transient", 408),
        (2, "invalid_input", 400),
    ]
    for row in rows:
        assert (row.provider_slug, row.adapter_revision) == ("renders", 1)
        assert (row.preset_version, row.aspect_class) == ("3", "portrait")
        assert row.error.startswith("HTTP ") and "render-8" not in row.error
    failed = [line for line in log_lines if "key=render-8:v1" in line and "operation_failed" in line]
    assert failed and all("preset_version=3" in line and "aspect_class=portrait" in line for line in failed)


def test_a_plain_request_has_empty_render_labels_on_its_histogram(api, enforced, charge_envelope):
    provider, _ = enforced
    before = calls(provider=provider.slug, outcome="succeeded", revision="1", preset_version="", aspect_class="")
    response = api.post(
        "/api/v1/operations",
        {"key": "charge-1:v1", "provider": provider.slug, "request": charge_envelope()},
        format="json",
    )
    assert response.status_code == 202, response.json()

    run_due()

    assert (
        calls(provider=provider.slug, outcome="succeeded", revision="1", preset_version="", aspect_class="")
        == before + 1
    )


def test_the_preset_and_aspect_labels_are_capped_the_rest_counted_as_other(monkeypatch):
    monkeypatch.setattr(telemetry, "_preset_label", telemetry.BoundedLabel(2))
    monkeypatch.setattr(telemetry, "_aspect_label", telemetry.BoundedLabel(1))
    seen = {"provider": "capped", "outcome": "succeeded", "revision": ""}

    for preset, aspect in (("1", "square"), ("2", "portrait"), ("3", "landscape"), ("4", "square"), ("", "")):
        telemetry.observe_provider_call(
            provider="capped", seconds=0.1, outcome="succeeded", preset_version=preset, aspect_class=aspect
        )

    assert calls(**seen, preset_version="1", aspect_class="square") == 1
    assert calls(**seen, preset_version="2", aspect_class="_other") == 1
    assert calls(**seen, preset_version="_other", aspect_class="_other") == 1
    assert calls(**seen, preset_version="_other", aspect_class="square") == 1
    # No labels (work without an intent) never take one of the capped places.
    assert calls(**seen, preset_version="", aspect_class="") == 1
    assert calls(**seen, preset_version="3", aspect_class="landscape") == 0
