"""A real n8n for the integration tests: installed once per machine, one user folder per
instance, driven through its own CLI (`import:*`, `update:workflow`, `execute`) and, for
production executions (webhooks, Wait resumes, the Error Trigger), `n8n start`.

Everything listens on 127.0.0.1 and every wait is bounded. n8n is pinned to 1.123.x, the
last line that runs on Node 20, and installed by ``scripts/install_n8n.sh`` into a cache
folder outside the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import tarfile
import time
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIR = REPO / "integrations" / "n8n"
WORKFLOWS_DIR = PACKAGE_DIR / "workflows"
INSTALL_SCRIPT = REPO / "scripts" / "install_n8n.sh"
INSTALL_TIMEOUT_SECONDS = 1800
CLI_TIMEOUT_SECONDS = 180
START_TIMEOUT_SECONDS = 120
STOP_TIMEOUT_SECONDS = 20

# The credential ids the templates name.
ONCEGUARD_CREDENTIAL_ID = "ogCredOnceguard1"
HEADER_CREDENTIAL_ID = "ogCredHeaderKey1"
# The Header Auth credential the templates' Webhook nodes check callers against, and what the
# tests' callers send.
CALLER_CREDENTIAL_ID = "ogCredWebhookIn1"
CALLER_HEADER, CALLER_TOKEN = "X-Webhook-Token", "og-n8n-tests-webhook-caller"
# The secret the replay receiver verifies Onceguard-Signature with (its n8n environment) and
# the tests give their replay targets.
REPLAY_SIGNING_SECRET = "og-n8n-tests-replay-signing-secret"
PACKAGE_NODE_TYPE = "n8n-nodes-onceguard.onceguard"
CUSTOM_NODE_TYPE = "CUSTOM.onceguard"
# The n8n environment variables the templates read their base URLs from (README, "Use it from
# n8n", step 4): a template imports and runs unedited once they are set.
TEMPLATE_ENV = {
    "onceguard": "ONCEGUARD_URL",
    "crm": "ONCEGUARD_CRM_URL",
    "charges": "ONCEGUARD_CHARGES_URL",
    "replay_secret": "ONCEGUARD_REPLAY_SIGNING_SECRET",
}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(message: str) -> None:
    """CI runs every n8n test: a missing n8n is a failure there, a skip on a laptop."""
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def install_n8n() -> tuple[Path, float]:
    """The n8n executable (installing it on first use), and how long this call took."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        unavailable("n8n tests need Node 20 and npm (apt-get install nodejs npm)")
    started = time.monotonic()
    try:
        result = subprocess.run(
            ["bash", str(INSTALL_SCRIPT)],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_SECONDS,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        unavailable(f"installing n8n took over {INSTALL_TIMEOUT_SECONDS}s ({INSTALL_SCRIPT})")
    if result.returncode != 0:
        unavailable(f"installing n8n failed ({INSTALL_SCRIPT}, exit {result.returncode}):\n{result.stderr[-3000:]}")
    binary = Path(result.stdout.strip().splitlines()[-1])
    if not binary.exists():
        unavailable(f"install_n8n.sh reported {binary}, which does not exist")
    return binary, time.monotonic() - started


def build_node_package(destination: Path) -> Path:
    """`npm ci` + `npm run build` + `npm pack`, unpacked: the package as a user installs it
    (package.json and dist/, no node_modules, so `n8n-workflow` resolves to n8n's own)."""
    env = {**os.environ, "npm_config_fund": "false", "npm_config_audit": "false"}
    steps = []
    if not (PACKAGE_DIR / "node_modules" / "n8n-workflow").exists():
        steps.append(["npm", "ci", "--loglevel=error"])
    steps += [["npm", "run", "build", "--silent"], ["npm", "pack", "--silent", "--pack-destination", str(destination)]]
    for step in steps:
        result = subprocess.run(
            step, cwd=PACKAGE_DIR, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
        )
        if result.returncode != 0:
            unavailable(
                f"building the node package failed at `{' '.join(step)}`:\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
            )
    (tgz,) = destination.glob("n8n-nodes-onceguard-*.tgz")
    with tarfile.open(tgz) as archive:
        archive.extractall(destination / "unpacked", filter="data")
    return destination / "unpacked" / "package"


def template_env(**values: str) -> dict[str, str]:
    """The n8n environment under which the templates, unedited, reach these servers (onceguard=,
    crm=, charges= URLs) and verify replays (replay_secret=)."""
    return {TEMPLATE_ENV[name]: value.rstrip("/") for name, value in values.items()}


def template(name: str) -> dict[str, Any]:
    """A workflow template as shipped: what it calls comes from the n8n's environment."""
    return json.loads((WORKFLOWS_DIR / f"{name}.json").read_text())


def node_named(workflow: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in workflow["nodes"] if n["name"] == name)


class CliError(AssertionError):
    pass


class N8n:
    """One n8n user folder (its own SQLite database) and, when started, one n8n process."""

    def __init__(self, binary: Path, folder: Path, *, custom_extensions: Path | None = None) -> None:
        self.binary = binary
        self.folder = folder
        self.port = free_port()
        self.custom_extensions = custom_extensions
        # Extra variables of the n8n process (the templates' TEMPLATE_ENV).
        self.extra_env: dict[str, str] = {}
        self.process: subprocess.Popen[bytes] | None = None
        # A copy of this folder taken before start(), for `n8n execute` runs that must not
        # share SQLite with the running server.
        self.spare: N8n | None = None
        self.logs = folder / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self._log_counter = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def database(self) -> Path:
        return self.folder / ".n8n" / "database.sqlite"

    def env(self) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("N8N_", "DB_", "WEBHOOK_", "EXECUTIONS_", "QUEUE_", "GENERIC_"))
        }
        env.update(
            N8N_USER_FOLDER=str(self.folder),
            N8N_PORT=str(self.port),
            N8N_LISTEN_ADDRESS="127.0.0.1",
            N8N_HOST="127.0.0.1",
            N8N_PROTOCOL="http",
            WEBHOOK_URL=f"{self.url}/",
            N8N_EDITOR_BASE_URL=f"{self.url}/",
            N8N_ENCRYPTION_KEY="onceguard-n8n-tests-only",
            N8N_ENFORCE_SETTINGS_FILE_PERMISSIONS="false",
            N8N_DIAGNOSTICS_ENABLED="false",
            N8N_VERSION_NOTIFICATIONS_ENABLED="false",
            N8N_TEMPLATES_ENABLED="false",
            N8N_PERSONALIZATION_ENABLED="false",
            N8N_HIRING_BANNER_ENABLED="false",
            N8N_BLOCK_ENV_ACCESS_IN_NODE="false",
            N8N_GIT_NODE_DISABLE_BARE_REPOS="true",
            N8N_SECURE_COOKIE="false",
            N8N_GRACEFUL_SHUTDOWN_TIMEOUT="3",
            N8N_LOG_LEVEL="info",
            N8N_LOG_OUTPUT="console",
            DB_SQLITE_POOL_SIZE="2",
            EXECUTIONS_DATA_SAVE_ON_SUCCESS="all",
            EXECUTIONS_DATA_SAVE_ON_ERROR="all",
            EXECUTIONS_DATA_SAVE_MANUAL_EXECUTIONS="true",
            NODE_ENV="production",
        )
        if self.custom_extensions is not None:
            env["N8N_CUSTOM_EXTENSIONS"] = str(self.custom_extensions)
        env.update(self.extra_env)
        return env

    # --- the CLI ---

    def cli(
        self, *args: str, timeout: float = CLI_TIMEOUT_SECONDS, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        self._log_counter += 1
        result = subprocess.run(
            [str(self.binary), *args],
            env=self.env(),
            cwd=self.folder,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        (self.logs / f"cli-{self._log_counter:03d}-{args[0].replace(':', '-')}.log").write_text(
            f"$ n8n {' '.join(args)}\nexit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
        )
        if check and result.returncode != 0:
            raise CliError(
                f"n8n {' '.join(args)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        return result

    def import_credentials(self, credentials: list[dict[str, Any]]) -> None:
        path = self.folder / "credentials.json"
        path.write_text(json.dumps(credentials))
        self.cli("import:credentials", f"--input={path}")
        path.unlink()

    def import_workflows(self, workflows: Iterable[dict[str, Any]]) -> None:
        directory = self.folder / "import"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        for workflow in workflows:
            (directory / f"{workflow['id']}.json").write_text(json.dumps(workflow))
        self.cli("import:workflow", "--separate", f"--input={directory}")
        shutil.rmtree(directory)

    def activate(self, *workflow_ids: str) -> None:
        for workflow_id in workflow_ids:
            self.cli("update:workflow", f"--id={workflow_id}", "--active=true")

    def activate_all(self, *, except_ids: Iterable[str] = ()) -> None:
        """Every imported workflow but ``except_ids``, in two CLI runs instead of one per
        workflow (each run boots n8n: seconds). An Error Trigger workflow must stay inactive:
        n8n retries activating it forever, and reports each failure through the workflow
        itself (its own error workflow), which would post a stray entry to the DLQ."""
        self.cli("update:workflow", "--all", "--active=true")
        for workflow_id in except_ids:
            self.cli("update:workflow", f"--id={workflow_id}", "--active=false")

    def execute(self, workflow_id: str, *, check: bool = True, env: dict[str, str] | None = None) -> Run:
        """`n8n execute --id`: a fresh n8n process runs the workflow from its Manual Trigger
        (``env``: variables of that process only, e.g. another server for the same template)."""
        saved = dict(self.extra_env)
        self.extra_env.update(env or {})
        try:
            result = self.cli("execute", f"--id={workflow_id}", "--rawOutput", check=False)
        finally:
            self.extra_env = saved
        run = Run.parse(result.stdout, result.stderr, result.returncode)
        if check and not run.ok:
            raise CliError(f"n8n execute --id={workflow_id} failed (exit {result.returncode}): {run.error_message}")
        return run

    def execute_async(self, workflow_id: str, *, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(self.binary), "execute", f"--id={workflow_id}", "--rawOutput"],
            env={**self.env(), **(env or {})},
            cwd=self.folder,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )

    def copy(self, folder: Path) -> N8n:
        """Another instance with this one's database (credentials and workflows), not started."""
        shutil.copytree(self.folder / ".n8n", folder / ".n8n")
        instance = N8n(self.binary, folder, custom_extensions=self.custom_extensions)
        instance.extra_env = dict(self.extra_env)
        return instance

    def install_package(self, package: Path) -> None:
        """What `npm install n8n-nodes-onceguard` in ~/.n8n/nodes leaves: n8n loads every
        n8n-nodes-* package there at start-up, as type `n8n-nodes-onceguard.onceguard`."""
        target = self.folder / ".n8n" / "nodes" / "node_modules" / "n8n-nodes-onceguard"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(package, target)

    # --- the server ---

    def start(self, *, active: Iterable[str] = ()) -> None:
        """`n8n start`, then wait until it is ready AND has activated the named workflows:
        n8n answers /healthz/readiness before it has registered the webhooks of its active
        workflows (about 2 s later here), so a test could otherwise meet a 404."""
        # Closed in stop(): the process writes to it for as long as it runs.
        log = open(self.logs / "start.log", "wb")
        self.process = subprocess.Popen(
            [str(self.binary), "start"],
            env=self.env(),
            cwd=self.folder,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self._start_log = log
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise CliError(f"n8n start exited {self.process.returncode}:\n{self.start_log()[-3000:]}")
                try:
                    ready = client.get(f"{self.url}/healthz/readiness").status_code == 200
                except httpx.TransportError:
                    ready = False
                log = self.start_log()
                if ready and all(_activation_line(log, workflow_id) for workflow_id in active):
                    return
                time.sleep(0.25)
        self.stop()
        raise CliError(f"n8n did not become ready in {START_TIMEOUT_SECONDS}s:\n{self.start_log()[-3000:]}")

    def start_log(self) -> str:
        path = self.logs / "start.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        self._start_log.close()
        self.process = None

    def create_api_key(self, *, scopes: Iterable[str] = ("execution:read",)) -> str:
        """An n8n API key for the public REST API, made as a user would in Settings → n8n API:
        set up the instance owner, then create a key (n8n 1.123's own REST endpoints; the
        `browser-id` header is what its session cookie is bound to)."""
        with httpx.Client(base_url=self.url, timeout=30.0, trust_env=False, headers={"browser-id": "og-tests"}) as http:
            owner = http.post(
                "/rest/owner/setup",
                json={
                    "email": "owner@example.invalid",
                    "firstName": "Test",
                    "lastName": "Owner",
                    "password": "Onceguard-tests-1",
                },
            )
            if owner.status_code != 200:
                raise CliError(f"n8n owner setup answered {owner.status_code}: {owner.text[:500]}")
            key = http.post("/rest/api-keys", json={"label": "onceguard", "scopes": list(scopes), "expiresAt": None})
            if key.status_code != 200:
                raise CliError(f"n8n API key creation answered {key.status_code}: {key.text[:500]}")
            return str(key.json()["data"]["rawApiKey"])

    def webhook(
        self, path: str, body: Any, *, timeout: float = 30.0, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        """A production webhook call (the workflow must be active and n8n started), from a caller
        the templates' Webhook nodes accept (their Header Auth credential)."""
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            return client.post(
                f"{self.url}/webhook/{path}", json=body, headers={CALLER_HEADER: CALLER_TOKEN, **(headers or {})}
            )

    # --- what n8n recorded ---

    def executions(self, workflow_id: str) -> list[dict[str, Any]]:
        """The executions of a workflow, oldest first, read from n8n's own database."""
        # sqlite3's own context manager ends the transaction but leaves the file open.
        with closing(sqlite3.connect(f"file:{self.database}?mode=ro", uri=True, timeout=10)) as db:
            db.row_factory = sqlite3.Row
            rows = db.execute(
                "SELECT id, status, mode, finished, retryOf FROM execution_entity WHERE workflowId = ? ORDER BY id",
                (workflow_id,),
            ).fetchall()
        return [dict(row) for row in rows]

    def wait_for_executions(
        self,
        workflow_id: str,
        *,
        count: int,
        statuses: Iterable[str] = ("success", "error", "crashed"),
        timeout: float = 60,
    ) -> list[dict[str, Any]]:
        wanted = set(statuses)
        deadline = time.monotonic() + timeout
        while True:
            done = [e for e in self.executions(workflow_id) if e["status"] in wanted]
            if len(done) >= count or time.monotonic() > deadline:
                return done
            time.sleep(0.25)


def _activation_line(log: str, workflow_id: str) -> str:
    return next(
        (line for line in log.splitlines() if f"(ID: {workflow_id})" in line and "Activated workflow" in line), ""
    )


class Run:
    """What `n8n execute --rawOutput` printed: the execution's run data, by node."""

    def __init__(self, data: dict[str, Any] | None, stdout: str, stderr: str, returncode: int) -> None:
        self.data = data or {}
        self.stdout, self.stderr, self.returncode = stdout, stderr, returncode

    @classmethod
    def parse(cls, stdout: str, stderr: str, returncode: int) -> Run:
        # A failed execution prints log lines around the JSON: take the first object that
        # starts a line and carries run data.
        decoder = json.JSONDecoder()
        data = None
        position = 0
        while data is None:
            start = stdout.find("{", position)
            if start < 0:
                break
            if start == 0 or stdout[start - 1] == "\n":
                try:
                    candidate, _ = decoder.raw_decode(stdout, start)
                except json.JSONDecodeError:
                    candidate = None
                if isinstance(candidate, dict) and "data" in candidate:
                    data = candidate
            position = start + 1
        return cls(data, stdout, stderr, returncode)

    @property
    def result(self) -> dict[str, Any]:
        return self.data.get("data", {}).get("resultData", {})

    @property
    def ok(self) -> bool:
        return bool(self.data) and not self.result.get("error")

    @property
    def error_message(self) -> str:
        error = self.result.get("error") or {}
        if error:
            return f"{error.get('message', '')} {error.get('description', '') or ''}".strip()
        return (self.stderr or self.stdout)[-2000:]

    def ran(self, node: str) -> bool:
        return node in self.result.get("runData", {})

    def outputs(self, node: str) -> list[list[dict[str, Any]]]:
        """Each output of the node's last run: a list of item JSONs."""
        runs = self.result.get("runData", {}).get(node) or []
        if not runs:
            return []
        main = (runs[-1].get("data") or {}).get("main") or []
        return [[item.get("json", {}) for item in (output or [])] for output in main]

    def output(self, node: str, index: int = 0) -> list[dict[str, Any]]:
        outputs = self.outputs(node)
        return outputs[index] if index < len(outputs) else []
