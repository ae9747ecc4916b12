"""The ledger's hooks: where the apps above it act in the same transaction as a ledger write.

The ledger is the floor: it imports nothing from ``alerts``, ``dlq`` or ``review``. When one
of its writes must be followed by theirs — a terminal failure becomes a DLQ entry, a settled
replay closes its Replay row, a stored payload is indexed by subject, an alert is raised —
the ledger sends one of the hooks below and those apps connect their receivers in
``AppConfig.ready()``.

A hook is explicit and typed: its signature is the declaration (keyword-only arguments, the
same for every receiver), ``send`` is checked against it, and receivers run synchronously,
in order, inside the caller's transaction. A receiver that raises rolls the caller's write
back with it — which is the point: a ``failed`` row never exists without its DLQ entry.
(Unlike Django signals: no ``sender``/``**kwargs`` soup, no weak references, no swallowing.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic, ParamSpec

if TYPE_CHECKING:
    # For the signatures only: ledger.platform.crypto imports this module, and crypto must stay
    # importable before Django's app registry is ready (ledger.models is not).
    from ledger.models import Operation

P = ParamSpec("P")


class Hook(Generic[P]):
    """A named point in a ledger write; receivers share the declaring function's signature."""

    def __init__(self, declaration: Callable[P, None]) -> None:
        self.name = declaration.__name__
        self.__doc__ = declaration.__doc__
        self._receivers: list[Callable[P, None]] = []

    def __repr__(self) -> str:
        return f"<Hook {self.name}: {len(self._receivers)} receiver(s)>"

    def connect(self, receiver: Callable[P, None]) -> Callable[P, None]:
        """Add a receiver (once: connecting it again changes nothing). Returns it, so this
        can be used as a decorator."""
        if receiver not in self._receivers:
            self._receivers.append(receiver)
        return receiver

    def disconnect(self, receiver: Callable[P, None]) -> None:
        if receiver in self._receivers:
            self._receivers.remove(receiver)

    @property
    def receivers(self) -> tuple[Callable[P, None], ...]:
        return tuple(self._receivers)

    @contextmanager
    def connected(self, receiver: Callable[P, None]) -> Iterator[Callable[P, None]]:
        """Connect a receiver for the length of a ``with`` block (tests)."""
        added = receiver not in self._receivers
        self.connect(receiver)
        try:
            yield receiver
        finally:
            if added:
                self.disconnect(receiver)

    @contextmanager
    def replaced(self, *receivers: Callable[P, None]) -> Iterator[None]:
        """Run a ``with`` block with exactly these receivers (none: the hook is silent)."""
        saved = self._receivers[:]
        self._receivers[:] = list(receivers)
        try:
            yield
        finally:
            self._receivers[:] = saved

    def send(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Call every receiver, in connection order. Exceptions propagate to the caller."""
        for receiver in tuple(self._receivers):
            receiver(*args, **kwargs)


def hook(declaration: Callable[P, None]) -> Hook[P]:
    """Declare a hook by its signature: the decorated function's body is never run."""
    return Hook(declaration)


# --- The hooks ---------------------------------------------------------------------------------


@hook
def operation_failed(*, operation: Operation) -> None:
    """A row has just reached ``failed`` (any path: a holder's fail, the sweeper, retry
    exhaustion). The DLQ records its entry, in the same transaction."""


@hook
def operation_finished(*, operation: Operation, actor: str) -> None:
    """A row has just reached a terminal state (after ``operation_failed`` when it failed).
    The DLQ settles the replay whose operation this is."""


@hook
def payload_written(*, tenant_id: int, record_type: str, record_id: int, values: list[Any], source: str) -> None:
    """A payload (or request) was stored for ``record_type``/``record_id``. Privacy indexes
    the data subjects it names. Sent inside a savepoint by ``ledger.platform.crypto.payload_written``,
    which logs and swallows a receiver's failure: indexing never fails the write."""


@hook
def alert_raised(*, tenant_id: int, kind: str, ref: str, summary: str) -> None:
    """Something an operator should hear about (``provider_paused``, ``review_needed``,
    ``operation_stuck``…). ``ref`` is an id or a key, ``summary`` never carries payload
    text. The alerts app records it and delivers it after commit."""


@hook
def adapter_revision_rolled_back(
    *, tenant_id: int, provider_id: int, revision_id: int, number: int, actor: str, reason: str
) -> None:
    """Adapter revision ``number`` of a provider was rolled back (by hand or by the canary
    watch), in the transaction of the move. The DLQ notes its entries whose operation the
    provider received and rejected under that revision: they are not re-sent on their own."""
