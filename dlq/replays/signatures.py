"""What a replay receiver checks and answers, with the target's signing secret: the
``Onceguard-Signature`` over the body (``replay_signature_verify``, docs/secrets.md) and the
acknowledgement ``Onceguard-Ack`` of the replay's id (``replay_ack_value``; ADR 0007). Pure
functions, shown in the templates and the docs.
"""

from __future__ import annotations

import hashlib
import hmac

from ledger.providers.adapters import verify_signature


def replay_ack_value(*, secret: str, replay_id: str) -> str:
    """What an acknowledging receiver answers in ``Onceguard-Ack`` for the replay (or lookup)
    whose ``Onceguard-Replay-Id`` it was sent: ``v1=`` and the hex HMAC-SHA256 under the
    target's signing secret of ``"ack." + id``. Only a receiver holding the secret that ran
    the step computing it can answer it — never n8n's own default answer, an echo server or
    a proxy's error page."""
    return "v1=" + hmac.new(secret.encode(), f"ack.{replay_id}".encode(), hashlib.sha256).hexdigest()


def replay_ack_verify(*, keys: list[str], replay_id: str, header: str | None) -> bool:
    """Whether ``header`` acknowledges ``replay_id`` under one of ``keys`` (during a
    rotation's overlap the receiver may still hold the previous secret)."""
    if not header:
        return False
    given = [part.strip() for part in header.split(",") if part.strip()]
    return any(
        hmac.compare_digest(replay_ack_value(secret=secret, replay_id=replay_id), candidate)
        for secret in keys
        for candidate in given
    )


def replay_signature_verify(*, keys: list[str], body: bytes, header: str, tolerance_seconds: int = 300) -> bool:
    """What a replay receiver does with ``Onceguard-Signature`` (docs/secrets.md): the ``t=``
    timestamp is at most ``tolerance_seconds`` away from now and one ``v1=`` is
    HMAC-SHA256(secret, "<t>." + body) under one of the secrets it holds (during a rotation:
    the new and the old one). A tampered body, a stale timestamp or an unknown secret fail."""
    return any(
        verify_signature(secret=secret, body=body, header=header, tolerance_seconds=tolerance_seconds)
        for secret in keys
    )
