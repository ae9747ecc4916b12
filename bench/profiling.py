"""``python -m bench --profile``: where the time of (b) and (c) goes, measured in-process.

Three views, each over a bounded number of operations:

1. Layer timers: chosen functions of every layer (WSGI handler, each middleware, DRF
   dispatch/auth/parse/validate/render, the ledger services, operation_from_row, the
   psycopg round trip) are wrapped with perf_counter timers; nested time is subtracted,
   so each layer's *self* time adds up to the total. Overhead: ~1 µs per wrapped call.
2. A/B runs: the same WSGI loop with the API's middleware stack trimmed, and with
   CONN_HEALTH_CHECKS off, to price those two directly.
3. cProfile (top functions by own time) written to var/bench-profile-*.txt.

Round trips per operation come from libpq's trace (bench.trace).
"""

from __future__ import annotations

import cProfile
import functools
import io
import json
import os
import pstats
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from bench import dbsetup, inproc
from bench.trace import count_round_trips

VAR = Path(__file__).resolve().parent.parent / "var"
API_MIDDLEWARE = ["config.middleware.ApiBodyLimitMiddleware"]


class Layers:
    """Self-time accounting (wall and thread CPU) for a set of wrapped functions.

    CPU time (``time.thread_time``) is what a layer costs the machine and is robust to
    other processes competing for the 2 cores; wall time is what the caller waits (the
    ``pg: wait`` layer is almost all wall: the thread sleeps while PostgreSQL works).
    """

    def __init__(self) -> None:
        self.wall: Counter[str] = Counter()
        self.cpu: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._stack: list[list[float]] = []
        self._restore: list[tuple[Any, str, Any]] = []

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        stack, wall, cpu, calls = self._stack, self.wall, self.cpu, self.calls
        clock, cpu_clock = time.perf_counter, time.thread_time

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            frame = [0.0, 0.0]
            stack.append(frame)
            c0 = cpu_clock()
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = clock() - t0
                dc = cpu_clock() - c0
                stack.pop()
                wall[name] += dt - frame[0]
                cpu[name] += dc - frame[1]
                calls[name] += 1
                if stack:
                    stack[-1][0] += dt
                    stack[-1][1] += dc

        return timed

    def patch(self, owner: Any, attr: str, name: str) -> None:
        """Wrap ``owner.attr`` (a module function, a class's method or an instance's).

        Missing attributes are skipped: the ledger changes while the bench stays."""
        if not hasattr(owner, attr):
            return
        self._restore.append((owner, attr, vars(owner).get(attr, _MISSING)))
        setattr(owner, attr, self.wrap(name, getattr(owner, attr)))

    def reset(self) -> None:
        self.wall.clear()
        self.cpu.clear()
        self.calls.clear()

    def undo(self) -> None:
        for owner, attr, original in reversed(self._restore):
            if original is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)
        self._restore.clear()


_MISSING = object()


def _common_layers(layers: Layers) -> None:
    import psycopg
    from django.db.backends import utils as db_utils
    from django.db.backends.postgresql.base import DatabaseWrapper

    from ledger.protocol import guard, services
    from ledger.protocol.transitions import claim as transitions_claim
    from ledger.protocol.transitions import trace as transitions_trace
    from ledger.store import sql

    layers.patch(psycopg.Connection, "wait", "pg: wait for server (network + PostgreSQL)")
    layers.patch(db_utils.CursorWrapper, "_execute", "db: Django cursor + psycopg client-side binding")
    layers.patch(DatabaseWrapper, "is_usable", "db: CONN_HEALTH_CHECKS SELECT 1 (client side)")
    layers.patch(services, "provider_for", "ledger: services.provider_for (ORM query build)")
    layers.patch(services, "operation_claim", "ledger: operation_claim (SQL text, params)")
    layers.patch(services, "operation_complete", "ledger: operation_complete")
    layers.patch(services, "guarded_transition", "ledger: guarded_transition (SQL text, params)")
    layers.patch(services, "request_fingerprint", "ledger: request_fingerprint (sha256 of JSON)")
    layers.patch(transitions_claim, "_answer_existing", "ledger: _answer_existing (replay decision)")
    layers.patch(sql, "operation_from_row", "ledger: sql.operation_from_row (model build)")
    layers.patch(services.log, "info", "ledger: log.info per completion")
    layers.patch(guard, "run_once", "guard: run_once")
    layers.patch(transitions_trace, "seal_json", "ledger: crypto.seal_json (encrypt at rest)")
    layers.patch(transitions_claim, "payload_written", "ledger: crypto.payload_written (subject index)")
    from ledger.web import serializers
    from ledger.web.apis import operations as apis

    for module in (guard, services, sql, apis, serializers):
        layers.patch(module, "open_json", "ledger: crypto.open_json (decrypt)")


def _http_layers(layers: Layers, handler_cls: Any) -> None:
    from django.conf import settings
    from django.core.handlers.base import BaseHandler
    from django.utils.module_loading import import_string
    from rest_framework import parsers, renderers, serializers, views

    from ledger.protocol import selectors
    from ledger.tenants import auth
    from ledger.web.apis import operations as apis

    layers.patch(handler_cls, "__call__", "django: WSGIHandler (request/response objects, signals)")
    layers.patch(BaseHandler, "_get_response", "django: URL resolve, view middleware, response render")
    for path in settings.MIDDLEWARE:
        cls = import_string(path)
        layers.patch(cls, "__call__", f"middleware: {cls.__name__}")
        for hook in ("process_view",):
            if hook in cls.__dict__:
                layers.patch(cls, hook, f"middleware: {cls.__name__}")
    layers.patch(views.APIView, "dispatch", "drf: dispatch (request wrap, negotiation, finalize)")
    layers.patch(views.APIView, "check_permissions", "drf: permissions + throttles")
    layers.patch(auth.ApiKeyAuthentication, "authenticate", "drf: ApiKeyAuthentication (ORM query build)")
    layers.patch(parsers.JSONParser, "parse", "drf: JSONParser.parse")
    layers.patch(apis, "validated_input", "drf: input serializer (construction)")
    layers.patch(serializers.Serializer, "is_valid", "drf: serializer validation")
    layers.patch(serializers.Serializer, "to_representation", "drf: output serializer (representation)")
    layers.patch(apis, "idempotency_key_from", "api: idempotency_key_from")
    layers.patch(selectors, "provider_slug", "api: selectors.provider_slug (cached)")
    layers.patch(renderers.JSONRenderer, "render", "drf: JSONRenderer.render")
    for cls in (apis.ClaimCreateApi, apis.OperationCompleteApi):
        layers.patch(cls, "post", "api: view body (glue)")


# --- WSGI in-process -------------------------------------------------------------------


class Wsgi:
    """Calls a Django WSGI handler the way gunicorn does, minus the socket."""

    def __init__(self, handler: Any, api_key: str):
        self.handler = handler
        self.auth = f"Bearer {api_key}"

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        data = json.dumps(body, separators=(",", ":")).encode()
        environ = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": path,
            "SCRIPT_NAME": "",
            "QUERY_STRING": "",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(data)),
            "HTTP_AUTHORIZATION": self.auth,
            "HTTP_ACCEPT": "application/json",
            "HTTP_HOST": "127.0.0.1",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "wsgi.input": io.BytesIO(data),
            "wsgi.errors": sys.stderr,
            "wsgi.url_scheme": "http",
            "wsgi.version": (1, 0),
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
        }
        box: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
            box["status"], box["headers"] = int(status.split()[0]), dict(headers)

        result = self.handler(environ, start_response)
        try:
            payload = b"".join(result)
        finally:
            result.close()
        return box["status"], json.loads(payload) if payload else {}, box["headers"]


def wsgi_ops(client: Wsgi) -> dict[str, Callable[[str], None]]:
    from bench.httpapi import claim_body

    def fresh(key: str) -> None:
        status, body, _ = client.post("/api/v1/claims", claim_body(key))
        if status != 201:
            raise RuntimeError(f"claim answered {status}: {body}")
        status, done, _ = client.post(
            f"/api/v1/operations/{body['id']}/complete",
            {"lease_token": body["lease_token"], "provider_ref": "ref", "response": {"ok": True}},
        )
        if status != 200:
            raise RuntimeError(f"complete answered {status}: {done}")

    def replay(key: str) -> None:
        status, body, headers = client.post("/api/v1/claims", claim_body(key))
        if status != 200 or headers.get("Idempotent-Replayed") != "true":
            raise RuntimeError(f"replay answered {status}: {body}")

    return {"fresh": fresh, "replay": replay}


def raw_reference(tenant_id: int) -> dict[str, Callable[[str], None]]:
    """(a)'s raw statements on one psycopg connection, run in this same loop harness."""
    from bench import common, raw

    dsn = common.libpq_dsn(os.environ["DATABASE_URL"])
    raw.create_tables(dsn)
    ops: dict[str, Callable[[str], None]] = {}
    for kind in ("fresh", "replay"):
        op = raw.lane_factory(dsn, raw.NARROW, kind, tenant_id)(0)
        ops[kind] = op
    return ops


def new_handler(middleware: list[str] | None = None) -> Any:
    from django.conf import settings
    from django.core.handlers.wsgi import WSGIHandler

    if middleware is None:
        return WSGIHandler()
    saved = settings.MIDDLEWARE
    settings.MIDDLEWARE = middleware
    try:
        return WSGIHandler()
    finally:
        settings.MIDDLEWARE = saved


@contextmanager
def server_side_binding() -> Iterator[None]:
    """Reconnect with OPTIONS server_side_binding=True, prepare_threshold=5 (psycopg's
    default; Django turns auto-prepare off unless asked), to price prepared statements."""
    from django.db import connection

    saved = connection.settings_dict["OPTIONS"]
    connection.close()
    connection.settings_dict["OPTIONS"] = {**saved, "server_side_binding": True, "prepare_threshold": 5}
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["OPTIONS"] = saved


@contextmanager
def cached_lookups() -> Iterator[None]:
    """Price proposal 'cache the API key and the provider per process': memoize
    ApiKeyAuthentication.authenticate (by header) and services.provider_for (by tenant,
    slug) in this process only, for the duration of the block."""
    from ledger.protocol import services
    from ledger.tenants import auth

    original_auth = auth.ApiKeyAuthentication.authenticate
    original_provider = services.provider_for
    principals: dict[str, Any] = {}
    providers: dict[tuple[Any, Any], Any] = {}

    def authenticate(self: Any, request: Any) -> Any:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if header not in principals:
            principals[header] = original_auth(self, request)
        return principals[header]

    def provider_for(*, tenant: Any, slug: str | None) -> Any:
        key = (getattr(tenant, "pk", tenant), slug)
        if key not in providers:
            providers[key] = original_provider(tenant=tenant, slug=slug)
        return providers[key]

    auth.ApiKeyAuthentication.authenticate = authenticate  # type: ignore[method-assign]
    services.provider_for = provider_for
    try:
        yield
    finally:
        auth.ApiKeyAuthentication.authenticate = original_auth  # type: ignore[method-assign]
        services.provider_for = original_provider


def combined(*contexts: Callable[[], Any]) -> Callable[[], Any]:
    @contextmanager
    def ctx() -> Iterator[None]:
        with ExitStack() as stack:
            for c in contexts:
                stack.enter_context(c())
            yield

    return ctx


# --- Measurement helpers ---------------------------------------------------------------


class KeyGen:
    def __init__(self) -> None:
        self.run = f"{int(time.time()):x}"
        self.n = 0

    def batch(self, tag: str, n: int) -> list[str]:
        self.n += 1
        return [f"prof-{self.run}-{tag}{self.n}-{i:05d}" for i in range(n)]


def timed_loop(op: Callable[[str], None], keys: list[str]) -> dict[str, float]:
    """Wall and CPU per op of a plain loop (no profiler). PostgreSQL CPU is read from the
    op's own backend when it names one (``op.backend_pid``), else Django's."""
    from django.db import connection

    from bench.common import proc_cpu_seconds

    backend = getattr(op, "backend_pid", None)
    if backend is None:
        connection.ensure_connection()
        backend = connection.connection.info.backend_pid
    pg0, cpu0, t0 = proc_cpu_seconds(backend), time.process_time(), time.perf_counter()
    for key in keys:
        op(key)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    pg = proc_cpu_seconds(backend) - pg0
    n = len(keys)
    return {"wall_ms": wall * 1000 / n, "python_cpu_ms": cpu * 1000 / n, "pg_cpu_ms": pg * 1000 / n}


def interleaved_plain(
    variants: list[tuple[str, dict[str, Callable[[str], None]], Callable[[], Any]]],
    keygen: KeyGen,
    n: int,
    rounds: int,
) -> dict[str, dict[str, dict[str, float]]]:
    """Each variant's fresh and replay loops in ``rounds`` chunks, round-robin, so A/B pairs
    see the same machine. ``ctx`` sets the variant up (and a few untimed ops warm it)."""
    sums: dict[str, dict[str, Counter[str]]] = {
        name: {"fresh": Counter(), "replay": Counter()} for name, _, _ in variants
    }
    done: dict[str, list[str]] = {}
    for name, ops, ctx in variants:
        with ctx():
            _, done[name] = pair_keys(keygen, "pd", n, ops["fresh"])
    fresh_keys = {name: keygen.batch("pf", n) for name, _, _ in variants}
    for r in range(rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for name, ops, ctx in order:
            with ctx():
                for key in keygen.batch("pw", 6):  # psycopg prepares on the 6th use
                    ops["fresh"](key)
                for kind, keys in (("fresh", fresh_keys[name][r::rounds]), ("replay", done[name][r::rounds])):
                    m = timed_loop(ops[kind], keys)
                    for k, v in m.items():
                        sums[name][kind][k] += v * len(keys)
    return {name: {kind: {k: v / n for k, v in c.items()} for kind, c in kinds.items()} for name, kinds in sums.items()}


def pair_keys(keygen: KeyGen, tag: str, n: int, fresh: Callable[[str], None]) -> tuple[list[str], list[str]]:
    """n fresh keys for a fresh loop and n already-finished keys for a replay loop."""
    finished = keygen.batch(tag + "done", n)
    for key in finished:
        fresh(key)
    return keygen.batch(tag, n), finished


Row = tuple[str, float, float, int]  # layer, wall µs/op, cpu µs/op, calls


def layer_report(layers: Layers, n: int, total_wall: float, total_cpu: float) -> list[Row]:
    rows: list[Row] = [
        (name, layers.wall[name] * 1e6 / n, layers.cpu[name] * 1e6 / n, layers.calls[name]) for name in layers.wall
    ]
    rows.append(
        (
            "(outside every wrapped layer: loop, client glue)",
            (total_wall - sum(layers.wall.values())) * 1e6 / n,
            (total_cpu - sum(layers.cpu.values())) * 1e6 / n,
            0,
        )
    )
    rows.sort(key=lambda r: -r[2])
    return rows


def format_layers(title: str, rows: list[Row], n: int) -> str:
    wall = sum(r[1] for r in rows)
    cpu = sum(r[2] for r in rows)
    out = [f"{title}: {wall / 1000:.2f} ms wall, {cpu / 1000:.2f} ms Python CPU per op (under layer timers)"]
    out.append(f"  {'CPU µs':>8} {'share':>6} {'wall µs':>8} {'calls':>7}  layer (self time)")
    for name, w, c, calls in rows:
        if c < 1 and w < 1:
            continue
        per = f"{calls / n:.1f}/op" if calls else ""
        out.append(f"  {c:8.0f} {100 * c / cpu:5.1f}% {w:8.0f} {per:>7}  {name}")
    return "\n".join(out)


@contextmanager
def patched(install: Callable[[Layers], None]) -> Iterator[Layers]:
    layers = Layers()
    install(layers)
    try:
        yield layers
    finally:
        layers.undo()


def measure_layers(install: Callable[[Layers], None], op: Callable[[str], None], keys: list[str]) -> Any:
    with patched(install) as layers:
        c0, t0 = time.thread_time(), time.perf_counter()
        for key in keys:
            op(key)
        return layer_report(layers, len(keys), time.perf_counter() - t0, time.thread_time() - c0)


def cprofile_to(path: Path, op: Callable[[str], None], keys: list[str], top: int = 40) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for key in keys:
        op(key)
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(top)
    buf.write("\n\n")
    stats.sort_stats("cumulative").print_stats(top)
    path.write_text(buf.getvalue())
    return str(path)


# --- Main ---------------------------------------------------------------------------------


def main(args: Any) -> int:
    from django.db import connection

    seeded = dbsetup.seed()
    tenant, provider = seeded["tenant"], seeded["provider"]
    n = max(50, min(args.ops, 400))
    keygen = KeyGen()
    report: list[str] = []
    doc: dict[str, Any] = {"ops": n}

    def say(text: str = "") -> None:
        print(text, flush=True)
        report.append(text)

    say(f"profile: {n} ops per measurement, in-process, single thread")
    guard_ops = {k: inproc.guard_factory(tenant, k)(0) for k in ("fresh", "replay")}
    svc_ops = {k: inproc.services_factory(tenant, provider, k)(0) for k in ("fresh", "replay")}
    handler = new_handler()
    dbsetup.quiet_logging()
    http = wsgi_ops(Wsgi(handler, seeded["api_key"]))
    slim = wsgi_ops(Wsgi(new_handler(API_MIDDLEWARE), seeded["api_key"]))
    paths = {"guard run_once": guard_ops, "services direct": svc_ops, "WSGI in-process": http}
    for ops in paths.values():  # warm-up: imports, caches, connection
        for key in keygen.batch("warm", 30):
            ops["fresh"](key)
            ops["replay"](key)

    say("\n== Plain loops (no profiler), A/B variants interleaved in rounds: per op ==")

    @contextmanager
    def no_health_checks() -> Iterator[None]:
        connection.health_check_enabled = False
        try:
            yield
        finally:
            connection.health_check_enabled = connection.settings_dict["CONN_HEALTH_CHECKS"]

    raw_ops = raw_reference(tenant.pk)
    variants: list[tuple[str, dict[str, Callable[[str], None]], Callable[[], Any]]] = [
        ("raw 1 conn (reference for the ratios)", raw_ops, nullcontext),
        ("guard run_once", guard_ops, nullcontext),
        ("guard run_once, prepared statements", guard_ops, server_side_binding),
        ("guard run_once, provider cached", guard_ops, cached_lookups),
        ("guard run_once, prepared + provider cached", guard_ops, combined(server_side_binding, cached_lookups)),
        ("services direct", svc_ops, nullcontext),
        ("services direct, prepared statements", svc_ops, server_side_binding),
        ("WSGI in-process", http, nullcontext),
        (f"WSGI, MIDDLEWARE={API_MIDDLEWARE}", slim, nullcontext),
        ("WSGI, CONN_HEALTH_CHECKS off", http, no_health_checks),
        ("WSGI, prepared statements", http, server_side_binding),
        ("WSGI, API key + provider cached", http, cached_lookups),
        (
            "WSGI, all four (slim middleware, no health check, prepared, cached)",
            slim,
            combined(no_health_checks, server_side_binding, cached_lookups),
        ),
    ]
    plain = interleaved_plain(variants, keygen, n, rounds=4)
    reference = plain["raw 1 conn (reference for the ratios)"]
    say("  (vs raw = raw wall / variant wall: the throughput ratio of single-connection serial loops)")
    for name, kinds in plain.items():
        for kind, m in kinds.items():
            vs = "" if name.startswith("WSGI") else f"  vs raw {reference[kind]['wall_ms'] / m['wall_ms']:5.2f}"
            say(
                f"  {name:<58} {kind:<6} wall {m['wall_ms']:6.3f} ms  python {m['python_cpu_ms']:6.3f} ms"
                f"  pg {m['pg_cpu_ms']:6.3f} ms{vs}"
            )
    doc["plain"] = plain

    say("\n== Round trips per op (libpq trace) ==")
    rts: dict[str, Any] = {}
    for name, ops in paths.items():
        fresh_keys, done_keys = pair_keys(keygen, "rt", 20, ops["fresh"])
        rts[name] = {"fresh": count_round_trips(ops["fresh"], fresh_keys)}
        rts[name]["replay"] = count_round_trips(ops["replay"], done_keys)
        for kind, r in rts[name].items():
            say(f"  {name:<18} {kind:<6} {r['round_trips_per_op']} round trips/op")
            for stmt, count in r["statements_per_op"].items():
                say(f"      {count:4.1f}×  {stmt}")
    doc["round_trips"] = rts

    say("\n== Layer self-time (µs per op; nested layers subtracted) ==")
    from django.core.handlers.wsgi import WSGIHandler

    layer_doc: dict[str, Any] = {}
    for name, ops, install in (
        ("guard run_once", guard_ops, _common_layers),
        ("services direct", svc_ops, _common_layers),
        ("WSGI in-process", None, None),
    ):
        for kind in ("fresh", "replay"):
            if ops is None:
                # The handler must be built after its middleware classes are wrapped.
                def install_http(layers: Layers) -> None:
                    _common_layers(layers)
                    _http_layers(layers, WSGIHandler)

                with patched(install_http) as layers:
                    client_ops = wsgi_ops(Wsgi(new_handler(), seeded["api_key"]))
                    fresh_keys, done_keys = pair_keys(keygen, "lh", n, client_ops["fresh"])
                    keys = fresh_keys if kind == "fresh" else done_keys
                    layers.reset()
                    c0, t0 = time.thread_time(), time.perf_counter()
                    for key in keys:
                        client_ops[kind](key)
                    rows = layer_report(layers, n, time.perf_counter() - t0, time.thread_time() - c0)
            else:
                fresh_keys, done_keys = pair_keys(keygen, "l", n, ops["fresh"])
                rows = measure_layers(install, ops[kind], fresh_keys if kind == "fresh" else done_keys)
            say(format_layers(f"{name} · {kind}", rows, n))
            layer_doc[f"{name} {kind}"] = [
                {"layer": r[0], "wall_us_per_op": round(r[1], 1), "cpu_us_per_op": round(r[2], 1), "calls": r[3]}
                for r in rows
            ]
    doc["layers"] = layer_doc

    say("\n== cProfile (top functions) ==")
    for name, ops in paths.items():
        for kind in ("fresh", "replay"):
            fresh_keys, done_keys = pair_keys(keygen, "cp", n, ops["fresh"])
            slug = name.split()[0].lower()
            path = cprofile_to(
                VAR / f"bench-profile-{slug}-{kind}.txt", ops[kind], fresh_keys if kind == "fresh" else done_keys
            )
            say(f"  {name} {kind}: {path}")

    (VAR / "bench-profile.txt").write_text("\n".join(report) + "\n")
    (VAR / "bench-profile.json").write_text(json.dumps(doc, indent=2, default=str))
    print(f"\nwrote {VAR / 'bench-profile.txt'} and {VAR / 'bench-profile.json'}")
    return 0
