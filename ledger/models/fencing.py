"""Restore fencing's tables (ADR 0012): the ledger's identity and epoch, and the holds a restore
left — keys the journal says may have been performed that the database no longer knows."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from ledger.models.tenants import Tenant


class LedgerIdentity(models.Model):
    """One row (id 1): who this ledger is, and how far its epoch has advanced. Created by the
    migration for new and existing databases alike; a restore brings back the identity and the
    epoch of its backup, which is how the ledger finds its own journal and sees that it went
    back in time. Moved only by ``ledger.protocol.fencing.epoch_advance``."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    # Names the journal: a fresh database starts a fresh journal, a restored one finds its own.
    ledger_id = models.CharField(max_length=36, unique=True)
    epoch = models.BigIntegerField(default=0)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="ledger_identity_one_row")]


class FenceHoldResolution(models.TextChoices):
    # Open: claims of the key answer 409 operation_held_after_restore. Moved out by a person
    # (the console's resolve) or by the provider's lookup (lift by lookup).
    OPEN = "open", "held"
    # A person decided the key may run again (nothing was performed, or once more is wanted).
    RELEASED = "released", "released by a person"
    # A person decided the effect happened: claims stay refused for good.
    PERFORMED = "performed", "performed, kept refused"
    # The provider's lookup found no such effect: the key may run.
    LOOKUP_NOT_FOUND = "lookup_not_found", "lifted: the provider has no such effect"
    # The provider's lookup found the effect: claims stay refused for good.
    LOOKUP_FOUND = "lookup_found", "the provider has it: kept refused"


# The resolutions after which the key may be claimed again.
FENCE_RELEASED = (FenceHoldResolution.RELEASED, FenceHoldResolution.LOOKUP_NOT_FOUND)


class FenceHold(models.Model):
    """A key the journal holds and the restored database does not know: its effect may have
    happened after the backup. Not an operation (no state of the operation table fits "we do
    not know whether this ran"); a claim of it answers 409 while it is open."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=255)
    # From the journal entry: the provider the effect was for (None: none named) and the state
    # the key had reached when it was journaled (sent, succeeded, failed, …).
    provider_id = models.BigIntegerField(null=True, blank=True)
    journaled_state = models.CharField(max_length=20)
    # The database's epoch when the hold was found (the backup's epoch).
    epoch = models.BigIntegerField()
    found_at = models.DateTimeField()
    resolution = models.CharField(max_length=20, choices=FenceHoldResolution.choices, default=FenceHoldResolution.OPEN)
    resolved_at = models.DateTimeField(null=True, blank=True)
    # "user:<username>" for a person, "lookup" for the provider's lookup.
    resolved_by = models.CharField(max_length=150, blank=True, default="")
    reason = models.CharField(max_length=500, blank=True, default="")
    # Claims refused while it was open (the console shows who keeps asking).
    refused_claims = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key"], name="fence_hold_tenant_key"),
            models.CheckConstraint(
                condition=Q(resolution=FenceHoldResolution.OPEN, resolved_at__isnull=True)
                | (~Q(resolution=FenceHoldResolution.OPEN) & Q(resolved_at__isnull=False)),
                name="fence_hold_resolved_has_time",
            ),
        ]
        indexes = [
            models.Index(fields=["found_at"], name="fence_hold_open", condition=Q(resolution="open")),
        ]
        permissions = [("resolve_fencehold", "Resolve restore holds")]
