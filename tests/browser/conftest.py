"""Headless Chromium for the admin page's browser tests (docs/testing.md, "Browser tests").

* ``chrome`` (module): a Selenium WebDriver for Debian's ``/usr/bin/chromium`` through its
  ``/usr/bin/chromedriver`` (packages chromium and chromium-driver, which scripts/setup.sh
  installs): headless, 1400x1000, its own profile in a temporary directory, the browser's
  console log kept. Selenium Manager is kept offline (``SE_OFFLINE``): nothing is downloaded.
  A missing package FAILS the test, like a missing broker (tests/conftest.py).
* :func:`screenshot` writes a PNG to ``run/artifacts/browser/`` (git-ignored, as ``/run/``)
  and prints its path.

Tests using ``chrome`` get the ``browser`` marker (tests/conftest.py), so ``-m "not browser"``
deselects them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
REPO = Path(__file__).resolve().parents[2]
#: Where screenshots go (git-ignored: /run/ in .gitignore).
ARTIFACTS = REPO / "run" / "artifacts" / "browser"
#: Poll interval of the waits on the page, seconds: what the timings measured are rounded to.
POLL = 0.05

T = TypeVar("T")


def _require_chromium() -> None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing: the browser tests need Debian's chromium and "
            "chromium-driver: run scripts/setup.sh",
            pytrace=False,
        )


@pytest.fixture(scope="module")
def chrome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    """Headless Chromium driven by Selenium (one browser per test module)."""
    _require_chromium()
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager: never download a driver
    profile = tmp_path_factory.mktemp("chromium")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox cannot start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(str(CHROMEDRIVER), log_output=str(profile / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver: WebDriver, name: str) -> Path:
    """Save the viewport as ``run/artifacts/browser/<name>.png`` and print the path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 10.0) -> T:
    """Poll ``probe`` every :data:`POLL` seconds until it returns something truthy; that
    value. AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except StaleElementReferenceException:  # the page redrew it meanwhile
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"the page did not show {what} within {timeout} s")
        time.sleep(POLL)


def find(driver: WebDriver, css: str) -> list[WebElement]:
    """The elements matching ``css`` now."""
    return list(driver.find_elements(By.CSS_SELECTOR, css))
