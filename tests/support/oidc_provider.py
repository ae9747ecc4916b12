"""A small OpenID Connect provider on loopback, for the console's single sign-on tests
(review.staff.oidc): discovery, its signing keys (JWKS), the authorization endpoint (code flow,
PKCE S256 required) and the token endpoint issuing RS256 ID tokens signed with joserfc.

There is no sign-in form: the authorization endpoint signs in whoever the test put in
``provider.person`` (its claims: ``sub``, ``email``, ``groups`` …) and redirects straight back
with a code. The test drives the browser's side with the Django test client and httpx.

``provider.tamper`` changes the next ID tokens the way an attacker or a misconfigured
provider would: another ``aud`` or ``iss``, an ``exp`` in the past, another ``nonce``, or a
signature by a key that is not in the JWKS (``"foreign_key": True``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from joserfc import jwt
from joserfc.jwk import RSAKey

from tests.support.loopback import LoopbackServer, QuietHandler

CLIENT_ID = "onceguard-console"
CLIENT_SECRET = "console-client-secret-for-tests-only"


def _s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")


class OidcProvider(LoopbackServer):
    def __init__(self) -> None:
        self.key = RSAKey.generate_key(2048, parameters={"kid": "test-1", "alg": "RS256", "use": "sig"})
        # Same kid, not published: a token it signs must fail the signature check.
        self.foreign_key = RSAKey.generate_key(2048, parameters={"kid": "test-1", "alg": "RS256", "use": "sig"})
        self.person: dict[str, Any] = {"sub": "alice-0001", "email": "alice@example.com", "groups": []}
        self.tamper: dict[str, Any] = {}
        self.codes: dict[str, dict[str, Any]] = {}
        self.token_requests: list[dict[str, str]] = []
        self.lock = threading.Lock()
        provider = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                if parts.path == "/.well-known/openid-configuration":
                    self.answer(200, json.dumps(provider.discovery()).encode())
                elif parts.path == "/jwks":
                    self.answer(200, json.dumps({"keys": [provider.key.as_dict(private=False)]}).encode())
                elif parts.path == "/authorize":
                    status, headers, body = provider.authorize(query)
                    self.answer(status, body, headers=headers)
                else:
                    self.answer(404, b"{}")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                if urlsplit(self.path).path == "/token":
                    status, body = provider.token(form)
                    self.answer(status, json.dumps(body).encode(), headers={"Cache-Control": "no-store"})
                else:
                    self.answer(404, b"{}")

        super().__init__(Handler)

    @property
    def issuer(self) -> str:
        return self.url

    def discovery(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.url}/authorize",
            "token_endpoint": f"{self.url}/token",
            "jwks_uri": f"{self.url}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_post", "client_secret_basic"],
        }

    def settings(self) -> dict[str, Any]:
        """The console's settings for this provider, from its discovery document."""
        doc = self.discovery()
        return {
            "OIDC_RP_CLIENT_ID": CLIENT_ID,
            "OIDC_RP_CLIENT_SECRET": CLIENT_SECRET,
            "CONSOLE_OIDC_ISSUER": doc["issuer"],
            "OIDC_OP_AUTHORIZATION_ENDPOINT": doc["authorization_endpoint"],
            "OIDC_OP_TOKEN_ENDPOINT": doc["token_endpoint"],
            "OIDC_OP_JWKS_ENDPOINT": doc["jwks_uri"],
            "OIDC_OP_USER_ENDPOINT": "",
        }

    # --- endpoints -------------------------------------------------------------------------

    def authorize(self, query: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if query.get("client_id") != CLIENT_ID or query.get("response_type") != "code":
            return 400, {}, b'{"error": "unauthorized_client"}'
        if "openid" not in query.get("scope", "").split():
            return 400, {}, b'{"error": "invalid_scope"}'
        # PKCE is required of every client here, as a bank's provider would.
        if query.get("code_challenge_method") != "S256" or not query.get("code_challenge"):
            return 400, {}, b'{"error": "invalid_request", "error_description": "PKCE S256 required"}'
        code = secrets.token_urlsafe(24)
        with self.lock:
            self.codes[code] = {
                "redirect_uri": query["redirect_uri"],
                "challenge": query["code_challenge"],
                "nonce": query.get("nonce"),
                "person": dict(self.person),
                "at": time.time(),
            }
        location = f"{query['redirect_uri']}?{urlencode({'code': code, 'state': query.get('state', '')})}"
        return 302, {"Location": location}, b""

    def token(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        self.token_requests.append(dict(form))
        if form.get("client_id") != CLIENT_ID or form.get("client_secret") != CLIENT_SECRET:
            return 401, {"error": "invalid_client"}
        with self.lock:
            grant = self.codes.pop(form.get("code", ""), None)
        if grant is None or form.get("grant_type") != "authorization_code":
            return 400, {"error": "invalid_grant"}
        if form.get("redirect_uri") != grant["redirect_uri"]:
            return 400, {"error": "invalid_grant", "error_description": "redirect_uri"}
        if _s256(form.get("code_verifier", "")) != grant["challenge"]:
            return 400, {"error": "invalid_grant", "error_description": "PKCE verifier"}
        return 200, {
            "access_token": secrets.token_urlsafe(24),
            "token_type": "Bearer",
            "expires_in": 300,
            "id_token": self.id_token(grant["person"], nonce=grant["nonce"]),
        }

    def id_token(self, person: dict[str, Any], *, nonce: str | None) -> str:
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "aud": CLIENT_ID,
            "iat": now,
            "exp": now + 300,
            "auth_time": now,
            "nonce": nonce,
            **person,
        }
        tamper = dict(self.tamper)
        key = self.foreign_key if tamper.pop("foreign_key", False) else self.key
        if "exp_offset" in tamper:
            claims["exp"] = now + int(tamper.pop("exp_offset"))
        claims.update(tamper)
        return jwt.encode({"alg": "RS256", "kid": "test-1", "typ": "JWT"}, claims, key)


def running_provider() -> OidcProvider:
    return OidcProvider().start()
