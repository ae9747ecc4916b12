"""The mock image API: asynchronous (submit → job id → poll → PNG), key-enforced, with switches."""

from __future__ import annotations

import hashlib
import io
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from PIL import Image

from relay import mock_images as mock_images_provider
from relay.testing import start_mock_image_provider
from tests.support.clocks import FakeClock

KEY = {"Idempotency-Key": "order-1001:render:v1"}
ASK = {"width": 64, "height": 40, "prompt": "a red bicycle"}


def submit(http: httpx.Client, url: str, body: dict | None = None, **headers: str) -> httpx.Response:
    return http.post(url + "/v1/renders", json=ASK if body is None else body, headers=headers)


def poll_until_done(http: httpx.Client, url: str, job_id: str, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = http.get(f"{url}/v1/renders/{job_id}").json()
        if job["status"] != "queued" or time.monotonic() > deadline:
            return job
        time.sleep(0.02)


def test_a_render_is_submitted_polled_and_fetched_as_a_real_png_of_the_asked_size(http, mock_images):
    submitted = submit(http, mock_images.url, **KEY)
    assert submitted.status_code == 202
    job = submitted.json()
    assert job["id"].startswith("job_") and job["status"] == "queued" and job["output"] is None
    assert submitted.headers["Location"] == f"/v1/renders/{job['id']}"

    done = poll_until_done(http, mock_images.url, job["id"])
    assert done["status"] == "succeeded"
    output = http.get(mock_images.url + done["output"]["url"])

    assert output.status_code == 200 and output.headers["Content-Type"] == "image/png"
    image = Image.open(io.BytesIO(output.content))
    assert (image.format, image.size) == ("PNG", (64, 40))
    assert done["output"]["sha256"] == hashlib.sha256(output.content).hexdigest()
    assert done["output"]["size"] == len(output.content)
    effects = mock_images.effects()
    assert (effects["renders"], effects["by_key"], effects["jobs"]) == (1, {KEY["Idempotency-Key"]: 1}, 1)


def test_the_same_key_returns_the_same_job_and_never_renders_twice(http, mock_images):
    first = submit(http, mock_images.url, **KEY).json()
    poll_until_done(http, mock_images.url, first["id"])
    again = submit(http, mock_images.url, **KEY)

    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first["id"] and again.json()["status"] == "succeeded"
    effects = mock_images.effects()
    assert (effects["submits"], effects["jobs"], effects["renders"]) == (2, 1, 1)


def test_the_same_key_submitted_many_times_at_once_is_one_job_and_one_render(mock_images):
    def one(_: int) -> str:
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            return submit(client, mock_images.url, **KEY).json()["id"]

    with ThreadPoolExecutor(max_workers=8) as pool:
        ids = set(pool.map(one, range(16)))
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        poll_until_done(client, mock_images.url, ids.pop())
    assert not ids
    effects = mock_images.effects()
    assert (effects["submits"], effects["jobs"], effects["renders"]) == (16, 1, 1)


def test_the_same_key_with_another_request_is_refused_422(http, mock_images):
    submit(http, mock_images.url, **KEY)
    reused = submit(http, mock_images.url, {**ASK, "width": 65}, **KEY)
    assert reused.status_code == 422 and reused.json() == {"error": "idempotency_key_reused"}
    assert mock_images.effects()["jobs"] == 1


def test_a_submission_without_a_key_or_with_a_bad_size_is_refused_400(http, mock_images):
    assert submit(http, mock_images.url).json() == {"error": "idempotency_key_required"}
    for bad in ({"width": 0, "height": 5}, {"width": 5000, "height": 5}, {"width": "8", "height": 5}, {"height": 5}):
        response = submit(http, mock_images.url, bad, **KEY)
        assert response.status_code == 400 and response.json()["error"] == "invalid_size"
    assert mock_images.effects()["jobs"] == 0


def test_a_job_is_found_by_its_key_for_reconciliation(http, mock_images):
    job = submit(http, mock_images.url, **KEY).json()
    found = http.get(mock_images.url + "/v1/renders", params={"idempotency_key": KEY["Idempotency-Key"]})
    unknown = http.get(mock_images.url + "/v1/renders", params={"idempotency_key": "nobody"})
    assert found.status_code == 200 and found.json()["id"] == job["id"]
    assert unknown.status_code == 404
    assert mock_images.effects()["lookups"] == 2


def test_a_slow_job_stays_queued_and_its_output_is_not_ready_until_its_time(http, mock_images, monkeypatch):
    clock = FakeClock()  # the provider's clock: its jobs render when it says
    monkeypatch.setattr(mock_images_provider, "time", clock)
    mock_images.set_switches(delay=0.4)
    job = submit(http, mock_images.url, **KEY).json()

    early = http.get(f"{mock_images.url}/v1/renders/{job['id']}")
    early_output = http.get(f"{mock_images.url}/v1/renders/{job['id']}/output")
    assert early.json()["status"] == "queued"
    assert early_output.status_code == 404 and early_output.json()["error"] == "not_ready"
    assert mock_images.effects()["renders"] == 0

    # Still queued 0.2 s in, done at 0.4 s (was: polling until done took over 0.2 s of wall clock).
    clock.sleep(0.2)
    assert http.get(f"{mock_images.url}/v1/renders/{job['id']}").json()["status"] == "queued"
    clock.sleep(0.2)
    done = poll_until_done(http, mock_images.url, job["id"])
    assert done["status"] == "succeeded"
    assert mock_images.effects()["renders"] == 1


def test_a_failing_job_ends_failed_without_an_output(http, mock_images):
    mock_images.script([{"fail": True}])
    failed = poll_until_done(http, mock_images.url, submit(http, mock_images.url, **KEY).json()["id"])
    normal = poll_until_done(
        http, mock_images.url, submit(http, mock_images.url, **{"Idempotency-Key": "other"}).json()["id"]
    )

    assert failed["status"] == "failed" and failed["output"] is None
    assert failed["error"]["code"] == "render_failed"
    assert http.get(f"{mock_images.url}/v1/renders/{failed['id']}/output").status_code == 404
    # The script was one step: the next job is normal again.
    assert normal["status"] == "succeeded"
    effects = mock_images.effects()
    assert (effects["failed"], effects["renders"]) == (1, 1)


def test_a_wrong_size_job_claims_the_asked_size_but_its_image_is_not(http, mock_images):
    mock_images.set_switches(wrong_size=True)
    done = poll_until_done(http, mock_images.url, submit(http, mock_images.url, **KEY).json()["id"])
    image = Image.open(io.BytesIO(http.get(mock_images.url + done["output"]["url"]).content))

    assert (done["output"]["width"], done["output"]["height"]) == (64, 40)
    assert image.format == "PNG" and image.size == (65, 41)


def test_a_wrong_type_job_claims_a_png_but_sends_a_jpeg(http, mock_images):
    mock_images.set_switches(wrong_type=True)
    done = poll_until_done(http, mock_images.url, submit(http, mock_images.url, **KEY).json()["id"])
    output = http.get(mock_images.url + done["output"]["url"])

    assert done["output"]["media_type"] == "image/png" and output.headers["Content-Type"] == "image/png"
    assert output.content.startswith(b"\xff\xd8\xff")
    assert Image.open(io.BytesIO(output.content)).format == "JPEG"


def test_a_scripted_submit_status_answers_without_creating_a_job(http, mock_images):
    mock_images.script([{"status": 429, "retry_after": 2}])
    throttled = submit(http, mock_images.url, **KEY)
    accepted = submit(http, mock_images.url, **KEY)

    assert throttled.status_code == 429 and throttled.headers["Retry-After"] == "2"
    assert accepted.status_code == 202
    assert mock_images.effects()["jobs"] == 1


def test_the_same_key_and_size_always_draw_the_same_pixels(http, mock_images):
    done = poll_until_done(http, mock_images.url, submit(http, mock_images.url, **KEY).json()["id"])
    first = http.get(mock_images.url + done["output"]["url"]).content
    mock_images.reset()
    again = poll_until_done(http, mock_images.url, submit(http, mock_images.url, **KEY).json()["id"])
    assert http.get(mock_images.url + again["output"]["url"]).content == first


@pytest.mark.parametrize(
    "switches",
    [{"delay": -1}, {"fail": "yes"}, {"colour": "red"}, {"status": 200}, {"retry_after": 1.5}],
    ids=["negative-delay", "non-bool", "unknown", "success-status", "float-retry-after"],
)
def test_switches_with_a_typo_are_refused_400(http, mock_images, switches):
    response = http.post(mock_images.url + "/_switches", json=switches)
    assert response.status_code == 400 and response.json()["error"] == "invalid_switches"
    assert http.post(mock_images.url + "/_script", json=[switches]).status_code == 400


def test_the_image_api_runs_as_its_own_process_too(http):
    server = start_mock_image_provider(process=True)
    try:
        job = submit(http, server.url, **KEY).json()
        assert poll_until_done(http, server.url, job["id"])["status"] == "succeeded"
        assert server.effects()["renders"] == 1
    finally:
        server.kill()
    assert not server.is_running()
