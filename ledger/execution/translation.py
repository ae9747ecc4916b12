"""One operation's intent, checked and translated (DESIGN §5, intents): the database side of
ledger.rules.intents — the tenant's uploads an intent names, the prompt templates its request
template places.

- :func:`intent_admit` runs at submission, before anything is written: the intent against
  the schema of the revision the new operation will run under, its upload references against
  the tenant's uploads (key and digest), and one rendering, so a value the translation or a
  prompt slot refuses is a ``400`` now rather than a failed attempt later. The rendering is
  not stored: the operation stores the intent.
- :func:`intent_translate` runs in the worker before each send, against the revision the
  attempt runs under (which a rollback may have changed): the same checks again, then the
  provider's request. A refusal there fails the attempt ``invalid_input`` without sending.

A prompt template the request template places is **pinned at acceptance** (ADR 0009): the
version :func:`intent_admit` rendered (the newest, for ``{{ prompt:name }}``) is stored with the
job (``pins``), and every attempt, retry and replay renders exactly that version, whatever was
published since.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ledger.execution import uploads
from ledger.models import PromptTemplate, Provider, Upload
from ledger.providers import prompts
from ledger.rules import intents
from ledger.rules.intents import IntentNotAccepted, RequestTemplateInvalid, UploadRef, UploadReferenceInvalid


@dataclass(frozen=True)
class Admitted:
    # The intent as stored (and fingerprinted): the submitted values, absent ones left out.
    values: dict[str, Any]
    # The sizes of the distinct uploads it references: admission counts them as queued bytes.
    upload_bytes: int
    # The uploads it references: kept by retention while the job can run (ledger.execution.uploads).
    uploads: tuple[UploadRef, ...]
    # The request it translates to now (checked by the caller like a submitted request; not stored).
    rendered: intents.Rendered

    @property
    def pins(self) -> dict[str, int]:
        """The prompt template versions this rendering used, stored with the job (ADR 0009)."""
        prompt = self.rendered.prompt
        return {} if prompt is None else {prompt.name: prompt.version}


def uploads_checked(*, tenant_id: int, refs: tuple[UploadRef, ...], accepted: bool = False) -> int:
    """The bytes of the uploads ``refs`` name, each of which must be this tenant's upload with
    that key and sha256; raises :class:`UploadReferenceInvalid` (the same answer for a key
    that does not exist, another tenant's and a wrong digest: an upload's existence is tenant
    data). ``accepted``: the intent is a job's, checked when it was accepted, so a missing
    upload was deleted since (an erasure, or retention after the job's lifetime) and the
    message says so."""
    if not refs:
        return 0
    found = {
        key: (sha, size)
        for key, sha, size in Upload.objects.filter(tenant_id=tenant_id, key__in={r.key for r in refs}).values_list(
            "key", "sha256", "size"
        )
    }
    for ref in refs:
        if found.get(ref.key, ("", 0))[0] != ref.sha256:
            key_name, sha_name = intents.upload_members(ref.field)
            if accepted:
                raise UploadReferenceInvalid(
                    f"The upload intent.{key_name} names is no longer stored: it was deleted after the job was"
                    " accepted (by an erasure request, or by retention once no job naming it could run)."
                    " Upload the file again and submit a new job.",
                    extra={"field": ref.field},
                )
            raise UploadReferenceInvalid(
                f"intent.{key_name} and intent.{sha_name} name no upload of this tenant with that digest"
                " (POST /api/v1/uploads answers both).",
                extra={"field": ref.field},
            )
    return sum(found[key][1] for key in {r.key for r in refs})


def intent_translate(
    *, tenant_id: int, provider: Provider, intent: Any, pins: Mapping[str, int] | None = None
) -> intents.Rendered:
    """The provider's request for ``intent`` under ``provider`` — the provider as the
    operation's adapter revision sees it (ledger.providers.revisions.revision_view) —, checked again:
    schema, uploads, prompt slots, with the prompt versions ``pins`` (the job's, from its
    acceptance). Raises the named error of the first problem."""
    schema, template = provider.intent_schema, provider.request_template
    if not schema or not template:
        raise IntentNotAccepted("This adapter revision of the provider declares no intent schema; it takes a request.")
    valid = intents.intent_validate(schema, intent)
    uploads_checked(tenant_id=tenant_id, refs=valid.uploads, accepted=True)
    return _render(tenant_id=tenant_id, provider=provider, values=valid.values, pins=pins)


def intent_as_sent(
    *, tenant_id: int, provider: Provider, intent: Any, pins: Mapping[str, int] | None = None
) -> intents.Rendered:
    """The request ``intent`` was translated to when it was sent, for reading what it asked
    (an output's size): checked against the schema and rendered, but its uploads not looked up
    again — one deleted since (retention, an erasure) changes nothing about what was asked."""
    if not provider.intent_schema or not provider.request_template:
        raise IntentNotAccepted("This adapter revision of the provider declares no intent schema; it takes a request.")
    valid = intents.intent_validate(provider.intent_schema, intent)
    return _render(tenant_id=tenant_id, provider=provider, values=valid.values, pins=pins)


def _render(
    *, tenant_id: int, provider: Provider, values: dict[str, Any], pins: Mapping[str, int] | None = None
) -> intents.Rendered:
    known = set(intents.member_names(provider.intent_schema))

    def prompt_text(name: str, version: int | None, values: dict[str, Any]) -> tuple[str, PromptTemplate]:
        # The job's pin wins over the template's own reference — the newest, or a version a later
        # adapter revision names: the job renders what it was accepted with (ADR 0009).
        if pins and name in pins:
            version = pins[name]
        row = prompts.prompt_template_get(tenant_id=tenant_id, name=name, version=version)
        if row is None:
            label = f"{name}@{version}" if version else name
            raise RequestTemplateInvalid(
                f"The request template places the prompt template {label!r}, which does not exist."
            )
        return prompts.prompt_fill(row, values, known=known), row

    return intents.template_render(provider.request_template, values, prompt_text=prompt_text)


def intent_admit(*, tenant_id: int, provider: Provider, intent: Any, pins: Mapping[str, int] | None = None) -> Admitted:
    """A submission's intent checked as the worker will check it (see the module's note).
    ``pins``: prompt versions the job keeps from the job it corrects (the DLQ's correction);
    otherwise the newest version of each unpinned prompt is the one it is pinned to."""
    if not provider.intent_schema or not provider.request_template:
        raise IntentNotAccepted("This provider declares no intent schema; send a request.")
    valid = intents.intent_validate(provider.intent_schema, intent)
    upload_bytes = uploads_checked(tenant_id=tenant_id, refs=valid.uploads)
    rendered = _render(tenant_id=tenant_id, provider=provider, values=valid.values, pins=pins)
    return Admitted(values=valid.values, upload_bytes=upload_bytes, rendered=rendered, uploads=valid.uploads)


def uploads_retained(*, tenant_id: int, refs: tuple[UploadRef, ...], seconds: float) -> None:
    """Keep the uploads an admitted intent names for ``seconds`` (ledger.execution.uploads.uploads_retain);
    one deleted since :func:`intent_admit` checked it refuses the job as a missing one is."""
    keys = {r.key for r in refs}
    if uploads.uploads_retain(tenant_id=tenant_id, keys=keys, seconds=seconds) < len(keys):
        # Deleted in between (a purge that locked it first, an erasure): say which field.
        uploads_checked(tenant_id=tenant_id, refs=refs)
        raise UploadReferenceInvalid("An upload this intent names was deleted while the job was being accepted.")
