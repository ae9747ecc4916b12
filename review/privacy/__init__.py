"""Privacy: personal data in payloads — masked, revealed with a reason, found, exported, erased.

``payloads`` says which columns hold a payload, in what state (sealed, plain, redacted), reveals
one only after its access-log row is written, keeps the keyed index of the identifiers in it
(the data-subject index) and makes the redaction marker; ``keys`` re-seals payloads and re-keys
the index under a new key; ``subjects`` reads a person's data trail through the index, never by
decrypting; ``erasure`` redacts one person's data everywhere as a recorded, resumable run, and
``erasure_n8n`` deletes the n8n executions that carried it (ADR 0005); ``erasure_admin`` is the
console's read-only list of those runs. Over the API: ``apis`` (payload reveal, the key's
``payload`` scope) and ``subject_apis`` (trail, export, erasure), routed by ``urls`` and
``subject_urls``.

May import: ``review.audit``, ``review.staff``, ``review.models``.
"""
