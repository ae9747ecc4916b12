"""The node package builds from the project's own files, passes its own lint (tsc + the n8n
community-node ESLint rules) and its unit tests (node --test), and packs without
node_modules or sources."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.n8n.support import PACKAGE_DIR, unavailable

pytestmark = pytest.mark.heavy


def npm(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["npm", *args], cwd=PACKAGE_DIR, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 0, f"npm {' '.join(args)}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module", autouse=True)
def installed(node_package: Path) -> None:
    """node_package ran `npm ci` (when needed) and the build."""
    if not (PACKAGE_DIR / "node_modules").exists():
        unavailable("integrations/n8n has no node_modules after the build")


def test_the_node_passes_its_lint_and_unit_tests() -> None:
    npm("run", "lint")
    assert "# fail 0" in npm("test").stdout


def test_the_package_declares_its_node_and_credential_and_ships_only_what_n8n_loads(node_package: Path) -> None:
    manifest = json.loads((node_package / "package.json").read_text())
    assert manifest["name"] == "n8n-nodes-onceguard"
    assert "n8n-community-node-package" in manifest["keywords"]
    assert manifest["n8n"]["n8nNodesApiVersion"] == 1
    for path in (*manifest["n8n"]["nodes"], *manifest["n8n"]["credentials"]):
        assert (node_package / path).is_file(), path
    assert manifest["peerDependencies"] == {"n8n-workflow": "1.x"}
    shipped = {p.relative_to(node_package).parts[0] for p in node_package.rglob("*")}
    assert shipped <= {"package.json", "README.md", "dist", "workflows"}, shipped
    assert (node_package / "dist" / "icons" / "onceguard.svg").is_file()


def test_every_template_is_a_workflow_n8n_can_import() -> None:
    # The import itself is exercised by the scenario modules; here: ids unique, no pinned
    # data, credentials referenced by id, no secrets in the files.
    ids = set()
    for path in sorted((PACKAGE_DIR / "workflows").glob("*.json")):
        workflow = json.loads(path.read_text())
        assert workflow["id"] not in ids and len(workflow["id"]) <= 16
        ids.add(workflow["id"])
        assert workflow["nodes"] and workflow["connections"] and not workflow.get("pinData")
        # No API key in a template: the credentials hold it.
        assert not re.search(r"\bog_[0-9a-f]{8}_", path.read_text()), path.name
        for node in workflow["nodes"]:
            for credential in node.get("credentials", {}).values():
                assert set(credential) == {"id", "name"}
    assert len(ids) == 7


@pytest.mark.django_db(transaction=True)
def test_the_credential_test_request_reads_onceguard_with_the_key_and_fails_without_it(
    node_package: Path, onceguard_url: str, api_key: str
) -> None:
    # The credential's own test request and header, read from the built class, sent as n8n
    # would send them (n8n resolves the expressions; here: the same substitutions).
    script = (
        "const { OnceguardApi } = require(process.argv[1]);"
        "const c = new OnceguardApi();"
        "console.log(JSON.stringify({ test: c.test, auth: c.authenticate }));"
    )
    credential = node_package / "dist" / "credentials" / "OnceguardApi.credentials.js"
    result = subprocess.run(["node", "-e", script, str(credential)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    described = json.loads(result.stdout)
    request = described["test"]["request"]
    assert request["baseURL"] == '={{$credentials.baseUrl.replace(/\\/+$/, "")}}'
    assert described["auth"]["properties"]["headers"] == {"Authorization": "=Bearer {{$credentials.apiKey}}"}
    url = f"{onceguard_url}{request['url']}"
    with httpx.Client(timeout=10, trust_env=False) as client:
        good = client.request(
            request["method"], url, params=request["qs"], headers={"Authorization": f"Bearer {api_key}"}
        )
        bad = client.request(request["method"], url, params=request["qs"], headers={"Authorization": "Bearer og_wrong"})
    assert good.status_code == 200, good.text
    assert bad.status_code == 401 and bad.json()["code"] == "unauthenticated"
