"""The ledger's tables are a package by purpose (ledger/models/): migrations and importers name
everything by the package, ``ledger.models``, whichever of its modules holds it."""

from __future__ import annotations

from typing import Any

import pytest
from django.apps import apps
from django.db.migrations.writer import MigrationWriter

import ledger.models
from ledger.models import Counter, HexBytesField, NewRowId, SealedJSONField


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (Counter(null=True), "ledger.models.Counter(null=True)"),
        (HexBytesField(hex_length=64), "ledger.models.HexBytesField(hex_length=64)"),
        (SealedJSONField(null=True), "ledger.models.SealedJSONField(null=True)"),
        (NewRowId("ledger_attempt"), "ledger.models.NewRowId('ledger_attempt')"),
    ],
)
def test_a_new_migration_names_the_ledgers_own_fields_by_the_package(value: Any, written: str) -> None:
    # makemigrations --check cannot see this: the migrations' state and the models resolve to
    # the same class, so a field that deconstructed to its module's path would only show in
    # the next migration written (and tie it to the module).
    assert MigrationWriter.serialize(value) == (written, {"import ledger.models"})


def test_every_table_of_the_ledger_is_importable_from_the_package() -> None:
    models = list(apps.get_app_config("ledger").get_models())
    assert models
    assert [m for m in models if getattr(ledger.models, m.__name__, None) is not m] == []
