"""Harness moved unchanged from tests/integration/test_browser_channel.py: CHROMEDRIVER, CHROMIUM, chromium, wait_until."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def chromium(
    profile: Path,
    fake_audio: Path | None = None,
    width: int = 1400,
    height: int = 900,
    *,
    extra: tuple[str, ...] = (),
    loopback_ice: bool = True,
) -> Any:
    """A headless Chromium under Selenium with a fresh profile; the caller quits it. `loopback_ice` lets WebRTC
    offer 127.0.0.1 (a bridge on this host); `extra` flags are added as they are."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must never reach out
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        "--autoplay-policy=no-user-gesture-required",
        # Chromium offers its addresses as they are, not mDNS names
        "--disable-features=WebRtcHideLocalIpsWithMdns",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        # WebRTC on loopback: Chromium offers 127.0.0.1 candidates
        *(("--allow-loopback-in-peer-connection",) if loopback_ice else ()),
        *extra,
    ):
        options.add_argument(flag)
    if fake_audio is not None:
        options.add_argument(f"--use-file-for-fake-audio-capture={fake_audio}")
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll `predicate` (bounded in time) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last value {last!r}")
