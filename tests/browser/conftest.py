"""Headless Chromium for the console's browser tests.

Debian's ``chromium`` is used (never a downloaded browser): installed with apt-get when
/usr/bin/chromium is missing (CI on a fresh machine), driven by Playwright's Python package.
Screenshots of every page go to test-artifacts/browser/.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"
PASSWORD = "correct horse battery"


def _ensure_chromium() -> None:
    if Path(CHROMIUM).exists():
        return
    if shutil.which("apt-get") is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run the browser tests: no /usr/bin/chromium and no apt-get")
        pytest.skip("no /usr/bin/chromium and no apt-get to install Debian's chromium")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} failed: {result.stderr[-2000:]}")
    if not Path(CHROMIUM).exists():
        pytest.fail("apt-get installed chromium but /usr/bin/chromium is missing")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium per test module. Playwright's sync API keeps an event loop running in
    this thread while it lives; Django's ORM (the tests' set-up) refuses to run inside one
    unless told it is safe (it is: one thread), so that is allowed for exactly this long."""
    _ensure_chromium()
    from playwright.sync_api import sync_playwright

    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                yield chromium
            finally:
                chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


class Console:
    """One signed-in browser tab on the live server, with named screenshots."""

    def __init__(self, browser: Any, base_url: str, test_name: str) -> None:
        self.context = browser.new_context(viewport={"width": 1360, "height": 900}, accept_downloads=True)
        self.context.set_default_timeout(15_000)
        self.page = self.context.new_page()
        self.base_url = base_url
        self.prefix = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def go(self, path: str) -> Any:
        return self.page.goto(self.base_url + path)

    def login(self, username: str, password: str = PASSWORD) -> None:
        self.go("/admin/login/")
        self.page.fill("#id_username", username)
        self.page.fill("#id_password", password)
        self.page.click("input[type=submit]")
        self.page.wait_for_selector("#user-tools")

    def logout(self) -> None:
        # Django's logout is a POST (CSRF-protected form in the header).
        self.page.click("#logout-form button")
        self.page.wait_for_load_state()

    def shot(self, name: str) -> Path:
        path = ARTIFACTS / f"{self.prefix}--{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def text(self) -> str:
        return self.page.inner_text("body")

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def console(browser: Any, live_server: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    def make() -> Console:
        tab = Console(browser, live_server.url, request.node.name)
        opened.append(tab)
        return tab

    opened: list[Console] = []
    yield make
    for tab in opened:
        tab.close()
