"""Django internals the ledger uses (docs/adr/0004-private-framework-apis.md).

**An instance loaded from a row without ``Model.__init__``** (``ModelState`` and the
instance's ``_state``). ``ledger.store.fast_rows`` builds every operation a named statement
returns (a replay's one row, a fresh claim→complete's three); ``Model.from_db`` — the public
way — calls ``Model.__init__``, whose loop assigns each of the 48 fields through ``setattr``
and sends ``pre_init``/``post_init``. Where that loop only stores the values (no receivers of
either signal, no field attribute that does more on assignment than a foreign key's id, no
``__init__`` of the model's own), this leaves the same instance behind: the values in its
``__dict__`` and a ``ModelState`` with ``adding = False`` and the database alias, as
``from_db`` sets them. Measured in-process on one operation row (thread CPU, 20,000 calls ×
5 rounds, this 2-core machine at load average ~10): ``from_db`` 10.4 µs, this 3.8 µs; with
``psycopg_private.result_shape`` (0.8 µs instead of ``result_columns``' 7.3 µs per result)
about 14 µs of a guard replay's ~350 µs of client CPU (4 %, above ADR 0004's 2 % bar). ``tests/ledger/test_fast_rows.py``
holds every statement's rows equal, field by field and type by type, to ``Manager.raw``'s
(and the instance's attributes and state), and ``tests/test_private_apis.py`` holds
``loaded_instance`` equal to ``from_db`` and falls back when a ``post_init`` receiver appears.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import Model, signals
from django.db.models.base import ModelState
from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute


def plain_fields(model: type[Model], attnames: Sequence[str]) -> bool:
    """Whether assigning each of ``attnames`` on ``model`` only stores the value (a foreign
    key's id attribute also forgets a cached related object; a new instance has none)."""
    return model.__init__ is Model.__init__ and all(
        not hasattr(attribute, "__set__") or isinstance(attribute, ForeignKeyDeferredAttribute)
        for attribute in (model.__dict__.get(name) for name in attnames)
    )


def loaded_instance(
    model: type[Model], alias: str, attnames: Sequence[str], values: Sequence[Any], *, plain: bool
) -> Any:
    """``model.from_db(alias, attnames, values)`` for a row of every concrete field in the
    model's order; built directly when ``plain`` (``plain_fields``) and nothing listens to
    the model's ``pre_init``/``post_init``."""
    if not plain or signals.pre_init.has_listeners(model) or signals.post_init.has_listeners(model):
        return model.from_db(alias, attnames, values)
    instance = model.__new__(model)
    instance.__dict__.update(zip(attnames, values, strict=True))
    state = instance._state = ModelState()
    state.adding = False
    state.db = alias
    return instance
