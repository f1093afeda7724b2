"""Headless Chromium driven by Selenium, as the browser tests and screenshots use it."""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def browser_available() -> bool:
    return bool(shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER))


@contextmanager
def chromium(width: int = 1500, height: int = 1000):
    """A fresh headless Chromium with its own profile, closed afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="neuron-explorer-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
                 f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def console_errors(driver) -> list[str]:
    """Severe messages the page logged to the console since the last call."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
