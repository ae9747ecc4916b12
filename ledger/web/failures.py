"""Transport failures in words: one place that turns a stored error text ("not delivered:
ConnectError to demo-crm.invalid:443: cannot resolve the destination (gaierror)") into a
sentence with its cause and the next step ("could not resolve demo-crm.invalid — edit the
target's URL"), for every page that shows one to a person (the DLQ entry, the operation, the
replay's result).

The raw text stays available behind a disclosure, after the same scrubbing as every stored
error text (ledger.platform.redaction): it is what is stored, so it is scrubbed again on the way out
for rows written before. The sentence names only a destination's host and port, never its
path or query (a webhook URL's path is often its secret).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.utils.safestring import SafeString

from ledger.platform.redaction import scrub
from ledger.web import display

# "… to <host>:<port>: …" as transport_error_text writes it.
_DESTINATION = re.compile(r"\bto (\[[0-9A-Fa-f:.]+\](?::\d+)?|[A-Za-z0-9._-]+(?::\d+)?)(?=[:\s)]|$)")
_HTTP_STATUS = re.compile(r"\bHTTP (\d{3})\b")


@dataclass(frozen=True)
class Explained:
    # A sentence with the cause and the next step; "" when the text is no failure we know.
    sentence: str
    # The stored text, scrubbed (ledger.platform.redaction).
    raw: str


def destination(url: str) -> str:
    """``host:port`` of ``url`` (the scheme's port when none is written); "" if it has none."""
    try:
        parts = urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return ""
    if not parts.hostname:
        return ""
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}" if port else host


def transport_error_text(exc: BaseException, url: str) -> str:
    """What to store for a transport error sending to ``url``: the error's kind, the
    destination (host and port only) and the library's own words — the evidence the sentence
    is made from. Stored error text is scrubbed by whoever stores it."""
    detail = " ".join(str(exc).split())[:300]
    where = destination(url)
    return f"{type(exc).__name__}" + (f" to {where}" if where else "") + (f": {detail}" if detail else "")


def explain_failure(message: str, *, status: int | None = None, url: str = "") -> Explained:
    """The sentence for a stored failure text (and the answer's HTTP status, if any)."""
    raw = scrub(message or "")
    found = _DESTINATION.search(raw)
    where = destination(url) if url else (found.group(1) if found else "")
    host = where.rsplit(":", 1)[0] if where and not where.endswith("]") else where
    dest_host, dest = host or "the receiver", where or "the receiver"
    text = raw.lower()
    if status is None:
        answered = _HTTP_STATUS.search(raw)
        status = int(answered.group(1)) if answered else None
    if "outbound policy" in text or "not allowed" in text:
        sentence = (
            f"the outbound policy does not allow sending to {dest} — add it to OUTBOUND_ALLOW or edit the target's URL"
        )
    elif any(s in text for s in ("cannot resolve", "name or service not known", "nodename nor servname", "gaierror")):
        sentence = f"could not resolve {dest_host} — edit the target's URL"
    elif "connection refused" in text or "errno 111" in text:
        sentence = f"connection refused by {dest} — is the receiver running?"
    elif "timeout" in text or "timed out" in text:
        sentence = (
            f"{dest_host} did not answer in time — check that it is up and not overloaded, or raise the"
            " target's timeout"
        )
    elif any(s in text for s in ("ssl", "certificate", "tls")):
        sentence = (
            f"the TLS handshake with {dest_host} failed — check the URL's scheme (http or https) and the"
            " receiver's certificate"
        )
    elif status is not None and status >= 500:
        sentence = (
            f"{dest_host} answered HTTP {status}, an error on its side — retry later, or look at the receiver's logs"
        )
    elif any(s in text for s in ("remoteprotocolerror", "readerror", "no answer", "connection reset")):
        sentence = (
            f"{dest_host} closed the connection without an answer — it may have acted: check there"
            " before sending it again"
        )
    elif "connecterror" in text or "connecttimeout" in text:
        sentence = f"could not connect to {dest_host} — check the target's URL and that the receiver is running"
    else:
        sentence = ""
    return Explained(sentence=sentence, raw=raw)


def failure_html(message: str, *, status: int | None = None, url: str = "") -> SafeString | str:
    """The sentence with the raw text behind a disclosure; the raw text alone when no
    sentence fits (it already says what it is)."""
    explained = explain_failure(message, status=status, url=url)
    if not explained.raw:
        return ""
    if not explained.sentence:
        # format_html: escaped once and marked safe (display.escape returns a plain str, which
        # the template escaped again: "record&#x27;s" on the page).
        return display.format_html("{}", explained.raw)
    return display.format_html(
        '<span class="og-failure" data-testid="failure-sentence">{}</span>'
        ' <details class="og-raw-error"><summary>raw error</summary><code>{}</code></details>',
        explained.sentence[:1].upper() + explained.sentence[1:],
        explained.raw,
    )
