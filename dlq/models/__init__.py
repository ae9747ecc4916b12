"""Models: the DLQ's tables, states and constraints (DESIGN §4). No business logic: every move
of an entry between states lives in ``dlq.entries.transitions``, every other write in the
services of the rooms above.

By purpose: ``states`` (every choice list: an entry's states, who moves entries out of each,
the allowed moves; the other enumerations), ``configuration`` (a tenant's n8n connection and
replay targets), ``entries`` (entries, their aliases, occurrences and change trail),
``replays`` (replays, bulk replays, run resumes, and the ledger key a replay is guarded by).

Import from the package (``from dlq.models import FailedEvent``), as Django's convention and
the migrations do: it names every model, choice and helper of the modules below, so a move
between them changes no importer.

May import: ``dlq.rules`` (the destination checks a form's ``clean`` asks).
"""

from dlq.models.configuration import (  # noqa: F401
    N8nConnection,
    ReplayTarget,
)
from dlq.models.entries import (  # noqa: F401
    FailedEvent,
    FailedEventAlias,
    FailedEventChange,
    FailedEventOccurrence,
)
from dlq.models.replays import (  # noqa: F401
    REPLAY_KEY_PREFIX,
    BulkReplay,
    Replay,
    RunResume,
    replay_ledger_key,
)
from dlq.models.states import (  # noqa: F401
    BUSINESS_KEY_SOURCES,
    ERROR_CLASS_CHOICES,
    FE,
    FE_ALLOWED_TRANSITIONS,
    FE_OPEN_STATES,
    FE_TERMINAL_STATES,
    BulkReplayStatus,
    FailedEventShape,
    FailedEventStatus,
    KeySource,
    PayloadFetch,
    PayloadSource,
    ReplayAck,
    ReplayOutcome,
    ReplayTrigger,
    fe_sources_of,
)
