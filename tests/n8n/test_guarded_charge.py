"""The guarded-charge template in a real n8n, imported unedited and run with `n8n execute --id`
(each run a fresh n8n process, whose environment names the provider: ONCEGUARD_CHARGES_URL):
twice in a row and twice at once charge once, and the relay between n8n and the provider, in
each fault mode, never makes two — key-enforced ends with one effect, key-advisory ends in review.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger.models import IdempotencyClass, Operation, OperationStatus, Provider, Tenant
from ledger.platform import tracing
from ledger.protocol import services
from ledger.recovery.sweeper import sweep
from relay.testing import start_mock_provider, start_relay
from tests.e2e.support import settle
from tests.n8n.support import CUSTOM_NODE_TYPE, N8n, Run, node_named, template, template_env
from tests.observability.otlp import OtlpReceiver

pytestmark = [pytest.mark.heavy, pytest.mark.django_db(transaction=True)]

S = OperationStatus
ENFORCED, ADVISORY = IdempotencyClass.KEY_ENFORCED, IdempotencyClass.KEY_ADVISORY
# The template as shipped, run against either provider by the environment of its n8n process.
TEMPLATE = "ogGuardedCharge1"
KEY_AS_EXECUTION_ID = "ogKeyIsExecution"
OTHER_AMOUNT, OTHER_AMOUNT_V1 = "ogOtherAmount001", "ogOtherAmountV1"
KEY = "order-1001:charge:v1"
PROVIDER_TIMEOUT = 2.0
RUN_TIMEOUT = 180


class Charges:
    """A mock provider of each class, each behind a fault relay (module-wide, reset per test)."""

    def __init__(self) -> None:
        self.mock = {ENFORCED: start_mock_provider("enforced"), ADVISORY: start_mock_provider("advisory")}
        self.relay = {cls: start_relay(mock) for cls, mock in self.mock.items()}

    def reset(self) -> None:
        for server in (*self.mock.values(), *self.relay.values()):
            server.reset()

    def env(self, cls: str) -> dict[str, str]:
        """The n8n environment under which the template charges through this class's relay."""
        return template_env(charges=self.relay[cls].url)

    def effects(self, cls: str) -> int:
        return self.mock[cls].effects()["count"]

    def stop(self) -> None:
        for server in (*self.relay.values(), *self.mock.values()):
            server.stop()


@pytest.fixture(scope="module")
def charges() -> Iterator[Charges]:
    servers = Charges()
    yield servers
    servers.stop()


def key_as_execution_id_workflow() -> dict[str, Any]:
    """The template with the key written as `{{ $execution.id }}`, a key that never repeats,
    loaded through N8N_CUSTOM_EXTENSIONS (node type CUSTOM.onceguard)."""
    workflow = template("guarded-charge")
    workflow["id"], workflow["name"] = KEY_AS_EXECUTION_ID, "key is an execution id"
    for node in workflow["nodes"]:
        if node["type"] == "n8n-nodes-onceguard.onceguard":
            node["type"] = CUSTOM_NODE_TYPE
    claim = node_named(workflow, "Claim")["parameters"]
    claim.update(keySource="key", key="={{ $execution.id }}")
    return workflow


def other_amount_workflow(*, version: int = 2) -> dict[str, Any]:
    """The template whose sample order has another amount under the same key; ``version`` 1
    is the node as saved workflows have it (four Claim outputs, refusals are errors)."""
    workflow = template("guarded-charge")
    workflow["id"], workflow["name"] = (OTHER_AMOUNT, OTHER_AMOUNT_V1)[version == 1], f"another amount, v{version}"
    for field in node_named(workflow, "Sample order")["parameters"]["assignments"]["assignments"]:
        if field["name"] == "amount":
            field["value"] = 9999
    if version == 1:
        for node in workflow["nodes"]:
            if node["type"] == "n8n-nodes-onceguard.onceguard":
                node["typeVersion"] = 1
        claim = workflow["connections"]["Claim"]["main"]
        workflow["connections"]["Claim"]["main"] = [claim[0], claim[1], claim[3], claim[4]]
    return workflow


@pytest.fixture(scope="module")
def n8n(n8n_base: N8n, node_package: Path, charges: Charges, tmp_path_factory: pytest.TempPathFactory) -> N8n:
    """One user folder with the template as shipped (and variants of it); n8n itself runs only
    inside each `n8n execute`, whose environment names the provider (the key-enforced one
    unless a test says otherwise). The node is also on N8N_CUSTOM_EXTENSIONS."""
    instance = n8n_base.copy(tmp_path_factory.mktemp("n8n-charge"))
    instance.custom_extensions = node_package
    instance.extra_env = charges.env(ENFORCED)
    instance.import_workflows(
        [
            template("guarded-charge"),
            key_as_execution_id_workflow(),
            other_amount_workflow(),
            other_amount_workflow(version=1),
        ]
    )
    return instance


def charge_provider(tenant: Tenant, charges: Charges, cls: str) -> Provider:
    return services.provider_upsert(
        tenant=tenant,
        slug="demo-charges",
        base_url=charges.relay[cls].url,
        idempotency_class=cls,
        lookup_path="/charges?idempotency_key={key}" if cls == ENFORCED else "",
        ref_pointer="/id",
        status_pointer="/status",
        success_values=["succeeded"],
        lookup_settle_seconds=0,
        timeout_seconds=PROVIDER_TIMEOUT,
    )


@pytest.fixture
def onceguard(tenant: Tenant, api_key: str, charges: Charges) -> Tenant:
    charges.reset()
    return tenant


def claim_outcome(run: Run) -> str:
    """Which of the Claim's outputs the sample order went down."""
    # Node version 2: one named output per row of the claim-answer table.
    names = ("proceed", "already_done", "failed", "retry_later", "needs_human")
    taken = [name for name, items in zip(names, run.outputs("Claim"), strict=False) if items]
    assert len(taken) == 1, f"the item went down {taken or 'no output'}: {run.error_message}"
    return taken[0]


def test_the_guarded_charge_run_twice_in_a_row_charges_once(n8n: N8n, onceguard: Tenant, charges: Charges) -> None:
    charge_provider(onceguard, charges, ENFORCED)

    first = n8n.execute(TEMPLATE)
    assert claim_outcome(first) == "proceed"
    (completed,) = first.output("Complete")
    assert completed["onceguard"]["status"] == S.SUCCEEDED
    op = Operation.objects.get(key=KEY)
    assert op.status == S.SUCCEEDED and op.provider_ref == completed["id"]
    # The node told Onceguard where the claim came from.
    assert op.workflow_id == TEMPLATE and op.execution_id

    second = n8n.execute(TEMPLATE)
    assert claim_outcome(second) == "already_done"
    (replayed,) = second.output("Claim", 1)
    assert replayed["onceguard"]["status"] == S.SUCCEEDED
    assert replayed["onceguard"]["provider_ref"] == op.provider_ref
    assert not second.ran("Charge")
    assert charges.effects(ENFORCED) == 1


def test_the_guarded_charge_run_twice_at_once_in_two_n8n_processes_charges_once(
    n8n: N8n, onceguard: Tenant, charges: Charges, tmp_path: Path
) -> None:
    charge_provider(onceguard, charges, ENFORCED)
    # The provider holds the first charge 4 s, so the second process claims while it is held.
    charges.mock[ENFORCED].script([{"delay": 4.0}])
    other = n8n.copy(tmp_path / "second")
    processes = [n8n.execute_async(TEMPLATE), other.execute_async(TEMPLATE)]
    runs = []
    for process in processes:
        try:
            stdout, stderr = process.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate(timeout=10)
        runs.append(Run.parse(stdout, stderr, process.returncode))
    outcomes = sorted(claim_outcome(run) for run in runs)
    # One process charged; the other was told to retry later (or, if it came after the
    # first had finished, got the recorded outcome). Never two charges.
    assert outcomes in (["proceed", "retry_later"], ["proceed", "already_done"]), outcomes
    assert charges.effects(ENFORCED) == 1
    assert Operation.objects.get(key=KEY).status == S.SUCCEEDED

    # A third run, now that the first finished: the recorded outcome, no charge.
    assert claim_outcome(n8n.execute(TEMPLATE)) == "already_done"
    assert charges.effects(ENFORCED) == 1


# relay mode → provider class → (status after the sweeper, effects, what the re-run's claim gets)
FAULTS: dict[str, dict[str, tuple[str, int, str]]] = {
    "fail-before-forward": {
        ENFORCED: (S.RETRY_WAIT, 1, "proceed"),  # looked up: not found → re-sent with the same key
        ADVISORY: (S.REVIEW, 0, "needs_human"),  # cannot be looked up: a human decides
    },
    "forward-then-drop-response": {
        ENFORCED: (S.SUCCEEDED, 1, "already_done"),  # looked up: found
        ADVISORY: (S.REVIEW, 1, "needs_human"),
    },
}


@pytest.mark.parametrize("cls", [ENFORCED, ADVISORY])
@pytest.mark.parametrize("mode", list(FAULTS))
def test_a_fault_between_n8n_and_the_provider_never_makes_two_effects(
    n8n: N8n, onceguard: Tenant, charges: Charges, mode: str, cls: str
) -> None:
    charge_provider(onceguard, charges, cls)
    swept_status, effects, rerun = FAULTS[mode][cls]
    charges.relay[cls].set_mode(mode)

    first = n8n.execute(TEMPLATE, env=charges.env(cls))
    assert claim_outcome(first) == "proceed"
    # The Charge node saw an error (a 502 or a dropped connection): the Fail node recorded
    # the outcome as unknown, so the operation is reconciled, never retried blindly.
    (failed,) = first.output("Fail")
    assert failed["onceguard"]["status"] == S.UNCERTAIN
    op = Operation.objects.get(key=KEY)

    charges.relay[cls].set_mode("forward-and-respond")
    settle(op.pk)
    sweep()
    op.refresh_from_db()
    assert op.status == swept_status

    second = n8n.execute(TEMPLATE, env=charges.env(cls))
    assert claim_outcome(second) == rerun
    op.refresh_from_db()
    if rerun == "proceed":
        assert op.status == S.SUCCEEDED
    assert charges.effects(cls) == effects
    assert charges.mock[cls].effects()["count"] <= 1


def test_a_replayed_declined_charge_comes_out_of_the_failed_output_not_already_done(
    n8n: N8n, onceguard: Tenant, charges: Charges
) -> None:
    charge_provider(onceguard, charges, ENFORCED)
    charges.mock[ENFORCED].script([{"status": 402}])
    first = n8n.execute(TEMPLATE)
    assert claim_outcome(first) == "proceed" and first.ran("Fail")
    op = Operation.objects.get(key=KEY)
    assert op.status == S.FAILED and op.error_class == "invalid_input"

    second = n8n.execute(TEMPLATE)

    assert claim_outcome(second) == "failed"
    (failed,) = second.output("Claim", 2)
    assert failed["onceguard"]["replayed"] is True and failed["onceguard"]["status"] == S.FAILED
    assert failed["onceguard"]["error_class"] == "invalid_input"
    assert second.ran("Respond: charge failed") and not second.ran("Respond: already charged")
    assert not second.ran("Charge") and charges.effects(ENFORCED) == 0


def test_a_key_made_of_the_execution_id_is_refused_before_onceguard_is_called(
    n8n: N8n, onceguard: Tenant, charges: Charges
) -> None:
    charge_provider(onceguard, charges, ENFORCED)
    run = n8n.execute(KEY_AS_EXECUTION_ID, check=False)
    assert not run.ok
    assert "execution's id" in run.error_message
    assert not Operation.objects.exists()
    assert charges.effects(ENFORCED) == 0


def test_a_key_reused_with_another_request_comes_out_of_needs_a_human_with_its_code_and_detail(
    n8n: N8n, onceguard: Tenant, charges: Charges
) -> None:
    charge_provider(onceguard, charges, ENFORCED)
    n8n.execute(TEMPLATE)
    run = n8n.execute(OTHER_AMOUNT)
    assert claim_outcome(run) == "needs_human"
    (held,) = run.output("Claim", 4)
    assert held["onceguard"]["code"] == "key_reused_with_different_request" and held["onceguard"]["detail"]
    assert not run.ran("Charge")
    assert charges.effects(ENFORCED) == 1


def test_onceguard_refusing_a_claim_fails_a_version_1_execution_with_its_title_code_and_detail(
    n8n: N8n, onceguard: Tenant, charges: Charges
) -> None:
    charge_provider(onceguard, charges, ENFORCED)
    n8n.execute(TEMPLATE)
    run = n8n.execute(OTHER_AMOUNT_V1, check=False)
    assert not run.ok
    error = run.result["error"]
    assert error["message"] == "Onceguard: Key reused with a different request (key_reused_with_different_request)"
    assert error["description"]
    assert error.get("httpCode") == "422"
    assert not run.ran("Charge")
    assert charges.effects(ENFORCED) == 1


def _middleware_reload(live_server: Any) -> None:
    """The live server's Django handlers build their middleware chains again, as a process
    started with the current settings would (the trace middleware is in them only while tracing
    is on). Every layer: the test server's static and media handlers answer other paths with
    their own chain, not their inner application's."""
    app = live_server.thread.httpd.get_app()
    while app is not None:
        app.load_middleware()
        app = getattr(app, "application", None)


def test_the_charge_is_one_trace_from_the_n8n_execution_to_the_provider_when_onceguard_traces(
    n8n: N8n, onceguard: Tenant, charges: Charges, live_server: Any
) -> None:
    """Node version 2 sends a traceparent (one per execution); Onceguard continues it in every
    API call's span and stores it on the operation (ADR 0015). The key never reaches a span."""
    charge_provider(onceguard, charges, ENFORCED)
    receiver = OtlpReceiver()
    tracing.configure({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}, batch=False)
    _middleware_reload(live_server)
    try:
        run = n8n.execute(TEMPLATE)
        assert claim_outcome(run) == "proceed"
        (claimed,) = run.output("Claim")
        (completed,) = run.output("Complete")
        trace_id = claimed["onceguard"]["trace_id"]
        assert len(trace_id) == 32 and completed["onceguard"]["trace_id"] == trace_id
        servers = receiver.named("POST /api/v1/")
        op = Operation.objects.get(key=KEY)
        assert tracing.trace_id_of(op.trace_context) == trace_id
        assert {s.name for s in servers} >= {
            "POST /api/v1/claims",
            "POST /api/v1/operations/<int:operation_id>/complete",
        }
        assert {s.trace_id for s in servers} == {trace_id}
        assert KEY.encode() not in receiver.everything()
    finally:
        tracing.configure({})
        _middleware_reload(live_server)
        receiver.close()
