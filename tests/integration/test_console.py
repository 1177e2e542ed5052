"""The console in a real browser: a SIPp call appears, a recovery shows `reconnecting` then clears, BYE removes it.

The bridge runs against the GPT-Live fake as its own process, whose second connection (the replacement)
answers its handshake 1.5 s late, so `reconnecting` lasts long enough to be seen on the page. Once the call is
listed and talking, the first connection is dropped at the fake (`/_fault?spec=1/abrupt_close`); the page must
show the recovery stage and then none, and the call must leave the list when SIPp sends BYE. A screenshot of
the console during the recovery is saved under the test's temp dir (its path is printed). Without the token, a
bridge bound with `--http-token-env` answers 401; a token in the URL, 400.
"""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import peers
import pytest

from tests.support.browser_channel import chromium, wait_until


def _fault(fake_url: str, spec: str) -> None:
    scheme, _, authority = fake_url.split("/", 3)[:3]
    control = scheme.replace("ws", "http", 1) + "//" + authority
    with urllib.request.urlopen(f"{control}/_fault?spec={spec}", timeout=5) as answer:
        assert answer.read() == b"ok\n"


def _texts(driver, selector: str) -> list[str]:
    """The text of every element matching `selector`, read in one go (the page redraws as events arrive, so
    element handles go stale)."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent)", selector
    )


def _row(driver, call_id: str) -> str:
    return " ".join(_texts(driver, f'tr[data-call-id="{call_id}"] td'))


def _stages(driver) -> list[str]:
    return _texts(driver, "#stages li")


def test_console_follows_a_sip_call_through_a_recovery(start_fake, start_bridge, tmp_path: Path) -> None:
    fake = start_fake("openai-live", "--fault", "2/slow_handshake:1500")
    http_port = peers.free_udp_port(also_tcp=True)
    bridge = start_bridge(
        *fake.bridge_args("openai-live"),
        "--http",
        f"127.0.0.1:{http_port}",
        env={"OPENAI_API_KEY": "sk-test"},
    )
    speech = peers.make_utterance(
        tmp_path / "speech.wav",
        "Please tell me the opening hours of the shop.",
        lead_silence_s=0.3,
        # The sentence loops: its first end (about 3.7 s into the call, when the bridge logs it) is when the
        # first connection is dropped, and the replacement is ready 1.5 s later; the second sentence begins
        # after that (about 6.1 s), so that it is the fresh speech the recovery waits for (HR9), and the
        # recovery is done at its end (about 8.5 s), two seconds before SIPp's BYE at 10.5 s.
        tail_silence_s=3.0,
        ulaw=True,
    )
    assert speech.ulaw_path == tmp_path / "speech.ul"  # uac_stream streams ./speech.ul
    driver = chromium(tmp_path / "profile")
    shot = tmp_path / "artefacts" / "console-recovery.png"
    shot.parent.mkdir()
    try:
        driver.get(f"http://127.0.0.1:{http_port}/")
        wait_until(lambda: driver.find_element("id", "feed-state").text == "live", 10, "the event feed")
        assert driver.find_element("id", "no-calls").is_displayed()
        with peers.ManagedProcess(
            [
                "sipp",
                "-sf",
                str(peers.SCENARIOS / "uac_stream.xml"),
                "-s",
                "sales",
                f"127.0.0.1:{bridge.sip_port}",
                "-i",
                "127.0.0.1",
                "-mi",
                "127.0.0.1",
                "-p",
                str(peers.free_udp_port()),
                "-m",
                "1",
                "-l",
                "1",
                "-d",
                "10500",
                "-nostdin",
            ],
            cwd=tmp_path,
            name="sipp",
        ) as sipp:
            wait_until(lambda: _row(driver, "call-1"), 10, "the SIPp call in the list")
            row = wait_until(
                lambda: "ready" in (r := _row(driver, "call-1")) and r, 10, "the call to be ready"
            )
            assert "sales" in row and "native" in row and "openai-live" in row, row
            bridge.wait_for(r"call call-1 caller utterance at \d+ ms", timeout=10)  # it is talking
            _fault(fake.url, "1/abrupt_close")
            wait_until(
                lambda: _texts(driver, "#recovery-now")[0].startswith("reconnecting"),
                5,
                "`reconnecting` on the page",
            )
            driver.save_screenshot(str(shot))
            print("console screenshot:", shot)
            wait_until(
                lambda: _texts(driver, "#recovery-now")[0] == "none", 10, "the recovery to clear on the page"
            )
            stages = _stages(driver)
            began = [i for i, s in enumerate(stages) if "recovery reconnecting (transport_lost" in s]
            assert began, stages
            assert any("recovery cleared" in s or "recovery done" in s for s in stages[began[0] :]), stages
            captions = _texts(driver, "#captions .caption")
            sipp.wait(timeout=30)
        wait_until(lambda: not _row(driver, "call-1"), 10, "the call to leave the list after BYE")
        assert driver.find_element("id", "no-calls").is_displayed()
    finally:
        driver.quit()
    bridge.wait_for(r"call call-1 ended after")
    assert shot.stat().st_size > 10_000
    if keep := os.environ.get("PARLORA_ARTEFACTS"):
        shutil.copy(shot, keep)
    assert any(c.startswith("caller") for c in captions), captions  # the caller's words, as they arrived
    assert any(c.startswith("assistant") for c in captions), captions  # and the echo's


def test_console_needs_the_token_off_loopback(start_bridge) -> None:
    http_port = peers.free_udp_port(also_tcp=True)
    start_bridge(
        "--http",
        f"127.0.0.1:{http_port}",
        "--http-token-env",
        "PARLORA_TEST_TOKEN",
        env={"PARLORA_TEST_TOKEN": "s3cret-token"},
    )
    base = f"http://127.0.0.1:{http_port}"
    with urllib.request.urlopen(base + "/", timeout=5) as page:  # the page itself holds no data
        assert b"parlora-bridge console" in page.read()
    for path in ("/calls", "/events", "/calls/call-1"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + path, timeout=5)
        assert refused.value.code == 401, path
    request = urllib.request.Request(base + "/calls", headers={"Authorization": "Bearer s3cret-token"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.status == 200
    with pytest.raises(urllib.error.HTTPError) as in_url:  # never from the URL: logs and history keep URLs
        urllib.request.urlopen(base + "/calls?token=s3cret-token", timeout=5)
    assert in_url.value.code == 400 and b"Authorization: Bearer" in in_url.value.read()
