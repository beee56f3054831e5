"""A real browser for the console's tests (issue 29): Debian's chromium driven by Selenium
through Debian's chromedriver (both installed by scripts/bootstrap.sh), headless, with a fresh
profile; axe-core from npm, installed into a test-owned folder (``var/axe-core``) and injected
into each page."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
AXE_DIR = REPO / "var" / "axe-core"
AXE_JS = AXE_DIR / "node_modules" / "axe-core" / "axe.min.js"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--window-size=1280,1000",
)


@contextmanager
def browser() -> Iterator[WebDriver]:
    assert Path(CHROMIUM).exists(), "chromium is not installed (scripts/bootstrap.sh)"
    assert Path(CHROMEDRIVER).exists(), "chromium-driver is not installed (scripts/bootstrap.sh)"
    with tempfile.TemporaryDirectory(prefix="orbit-console-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            driver.set_page_load_timeout(60)
            yield driver
        finally:
            driver.quit()


def sign_in(driver: WebDriver, base_url: str, name: str, password: str) -> None:
    driver.get(base_url + "/login")
    driver.find_element(By.NAME, "name").send_keys(name)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "form[action='/login'] button").click()
    until(lambda: "Signed in as" in driver.page_source, 30, f"signed in as {name}")


def until(pred: Callable[[], Any], timeout: float, what: str, step: float = 0.2) -> Any:
    end = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(step)


def axe_source() -> str:
    """axe-core's script, installed from npm on first use (``npm install axe-core``)."""
    if not AXE_JS.exists():
        AXE_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(AXE_DIR),
             "axe-core@4"],
            check=True, timeout=300,
        )  # fmt: skip
    return AXE_JS.read_text(encoding="utf-8")


def serious_violations(driver: WebDriver) -> list[dict[str, Any]]:
    """axe-core's violations of impact serious or critical on the current page."""
    driver.execute_script(axe_source())
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document).then(r => done(JSON.stringify(r.violations)))"
        ".catch(e => done(JSON.stringify("
        "[{id: 'axe-error', impact: 'critical', help: String(e)}])));"
    )
    found = json.loads(result)
    return [
        {"id": v["id"], "impact": v["impact"], "help": v.get("help"),
         "nodes": [n.get("html") for n in v.get("nodes", [])][:3]}
        for v in found
        if v.get("impact") in ("serious", "critical")
    ]  # fmt: skip


def screenshot(driver: WebDriver, name: str) -> None:
    """docs/console/NAME.png, when ORBIT_CONSOLE_SCREENSHOTS=1 (the committed screenshots)."""
    import os

    if os.environ.get("ORBIT_CONSOLE_SCREENSHOTS") == "1":
        target = REPO / "docs" / "console" / f"{name}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        height = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(1280, min(max(int(height) + 40, 600), 2400))
        driver.save_screenshot(str(target))
        driver.set_window_size(1280, 1000)
