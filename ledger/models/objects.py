"""Files in the objects storage (ledger.execution.objects), by their facts: what a tenant
uploaded for its jobs to name, and the validated output an operation published."""

from __future__ import annotations

from django.db import models

from ledger.models.operations import Operation
from ledger.models.tenants import Tenant


class Upload(models.Model):
    """A file a tenant uploaded (``POST /api/v1/uploads``, ledger.execution.uploads), stored outside
    the queue through the ``onceguard_objects`` storage (ledger.execution.objects). Content addressed
    per tenant: the same bytes from the same tenant are one row, one object and one key.
    Its facts are immutable: written once, after its checks passed; deleted by retention
    (never while a job that names it can still run: ``retain_until``) or by an erasure. Jobs
    refer to it by ``key`` and ``sha256``; the queue never carries the bytes."""

    # Indexed by the unique (tenant, sha256) and (tenant, created_at).
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    # "up_" + sha256: what a job names; readable only with an API key of this tenant.
    key = models.CharField(max_length=80)
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    # Recognised from the content, never taken from the client's Content-Type.
    media_type = models.CharField(max_length=64)
    width = models.PositiveIntegerField(null=True, blank=True)
    height = models.PositiveIntegerField(null=True, blank=True)
    # Where the bytes are in the objects storage; internal, never shown.
    storage_name = models.CharField(max_length=300)
    created_at = models.DateTimeField(auto_now_add=True)
    # Retention keeps the upload at least until then, whatever its TTL: raised (never lowered)
    # by each accepted job that names it, to the end of that job's lifetime plus its last
    # attempt's lease (ledger.execution.uploads.uploads_retain). Null: no job ever named it.
    retain_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "ledger_upload"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "sha256"], name="upload_unique_digest_per_tenant"),
            models.UniqueConstraint(fields=["tenant", "key"], name="upload_unique_key_per_tenant"),
        ]
        # Retention reads a tenant's uploads by age.
        indexes = [models.Index(fields=["tenant", "created_at"], name="upload_tenant_created_idx")]

    def __str__(self) -> str:
        return self.key


class OperationOutput(models.Model):
    """The validated output of an operation (ledger.execution.outputs): fetched into quarantine,
    checked (media type by content, size, dimensions, digest), then published here. A row
    exists only for an output that passed; one that failed was deleted and failed the
    operation as ``invalid_output``. Its own table (not columns of the hot operations
    table), tenant-scoped like every read of it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    # Deleted with its operation (retention deletes the bytes first: review.retention).
    operation = models.OneToOneField(Operation, on_delete=models.CASCADE, related_name="output")
    # "out_" + sha256: the same bytes have the same key, whichever operation made them.
    key = models.CharField(max_length=80)
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    media_type = models.CharField(max_length=64)
    width = models.PositiveIntegerField(null=True, blank=True)
    height = models.PositiveIntegerField(null=True, blank=True)
    storage_name = models.CharField(max_length=300)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "ledger_operationoutput"
        indexes = [models.Index(fields=["tenant", "key"], name="opoutput_tenant_key_idx")]

    def __str__(self) -> str:
        return self.key
