"""The control plane against a real browser (DESIGN §15): a page of another origin changes nothing.

The bridge listens on loopback without a token, the usual set-up, with a SIPp call live. Headless Chromium
opens a page served from another origin — 127.0.0.2 (cross-site) and another port of 127.0.0.1 (same-site) —
whose script tries every state-changing route as a page can without the bridge's consent: `fetch()` in
`no-cors` mode (text/plain and form-encoded bodies), a CORS fetch with a JSON body (a preflight the bridge
never grants), `navigator.sendBeacon` and a `text/plain` form post carrying JSON (the classic JSON CSRF). The
`POST /calls` target is a UDP socket of the test's: an INVITE on it would be a call placed. Nothing happens: no
INVITE, the call is still up, the bridge is not draining, and the bridge's log shows each route refused.
Then the same three requests from a script (JSON, no Origin) do act, so the checks could see it if they did.

With a token, the console signs in with a form and keeps working on its HttpOnly cookie (the URL never holds
the token).
"""

from __future__ import annotations

import concurrent.futures
import functools
import http.server
import json
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import peers
import pytest

from tests.support.browser_channel import chromium, wait_until
from tests.support.ops_live import _stream_in_background

ROUTES = ("/calls", "/drain", "/calls/call-1/hangup", "/talk")

ATTACK = """<!doctype html><title>elsewhere</title><body><script>
const base = BASE;
const bodies = {"/calls": JSON.stringify({to: TARGET}), "/drain": "", "/calls/call-1/hangup": "",
                "/talk": JSON.stringify({type: "offer", sdp: "v=0\\r\\n"})};
const log = [];
async function attempt(name, fn) {
  try { await fn(); log.push(name + ": sent"); } catch (e) { log.push(name + ": " + e); }
}
function formPost(path, json) {  // enctype text/plain: name=value, shaped so that the body is JSON
  const frame = document.createElement("iframe");
  frame.name = "f" + path.replace(/\\W/g, "");
  document.body.append(frame);
  const form = document.createElement("form");
  form.method = "POST"; form.action = base + path; form.enctype = "text/plain"; form.target = frame.name;
  const input = document.createElement("input");
  input.type = "hidden"; input.name = json.slice(0, -1) + ',"pad":"'; input.value = '"}';
  form.append(input); document.body.append(form); form.submit();
}
(async () => {
  for (const [path, body] of Object.entries(bodies)) {
    await attempt("no-cors text " + path, () => fetch(base + path, {method: "POST", mode: "no-cors", body}));
    await attempt("no-cors form " + path, () => fetch(base + path, {method: "POST", mode: "no-cors",
        headers: {"content-type": "application/x-www-form-urlencoded"}, body}));
    await attempt("cors json " + path, () => fetch(base + path, {method: "POST",
        headers: {"content-type": "application/json"}, body}));
    await attempt("beacon " + path, async () => { if (!navigator.sendBeacon(base + path, body)) throw "refused"; });
    formPost(path, body || '{"x":1}');
  }
  await new Promise((r) => setTimeout(r, 2000));  // the form posts' answers
  window.attackLog = log;
})();
</script></body>"""


@pytest.fixture
def http_port() -> int:
    return peers.free_udp_port(also_tcp=True)


@pytest.fixture
def attacker_site(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    """A static file server on 127.0.0.2 and one on another port of 127.0.0.1: their origins."""
    root = tmp_path / "elsewhere"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    servers = [http.server.ThreadingHTTPServer((host, 0), handler) for host in ("127.0.0.2", "127.0.0.1")]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield root, [f"http://{s.server_address[0]}:{s.server_address[1]}" for s in servers]
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def _get(url: str, token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _post_json(url: str, body: dict[str, Any] | None = None) -> int:
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _invites(sock: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            data = sock.recv(65535)
        except BlockingIOError:
            return out
        if data.startswith(b"INVITE"):
            out.append(data)


def test_a_page_of_another_origin_changes_nothing(
    start_bridge, utterance, attacker_site, http_port: int, tmp_path: Path
) -> None:
    callee = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    callee.bind(("127.0.0.1", 0))
    callee.setblocking(False)
    target = f"sip:900123@127.0.0.1:{callee.getsockname()[1]}"
    root, origins = attacker_site
    base = f"http://127.0.0.1:{http_port}"
    (root / "index.html").write_text(
        ATTACK.replace("BASE", json.dumps(base)).replace("TARGET", json.dumps(target))
    )
    bridge = start_bridge("--http", f"127.0.0.1:{http_port}")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = _stream_in_background(pool, bridge, utterance, tmp_path / "sipp", 25.0)
        bridge.wait_for(r"call call-1 media: PCMU/8000", timeout=20)
        driver = chromium(tmp_path / "profile")
        try:
            for origin in origins:
                driver.get(origin + "/")
                log = wait_until(lambda: driver.execute_script("return window.attackLog"), 30, "the attack")
                print(origin, log)
        finally:
            driver.quit()
        status, calls = _get(base + "/calls")
        live = [c["call_id"] for c in calls["calls"]]
        ready = _get(base + "/readyz")
        sip = _get(base + "/sip")[1]
        invites = _invites(callee)
        refused = re.findall(r"http: refused POST '([^']+)' \((\w+)\)", bridge.log)
        # the same requests from a script (JSON, no Origin) do act: the checks above would have seen them
        hangup = _post_json(base + "/calls/call-1/hangup")
        bridge.wait_for(r"hung up from the console", timeout=10)
        placed = _post_json(base + "/calls", {"to": target})
        invited = wait_until(lambda: _invites(callee), 10, "the INVITE of a call placed from a script")
        drained = _post_json(base + "/drain")
        bridge.wait_for(r"POST /drain: draining", timeout=10)
        call.result(timeout=60)
    callee.close()
    assert invites == [], invites[0][:200]  # no call was placed
    assert not sip.get("outbound"), sip.get("outbound")
    assert live == ["call-1"], calls  # not hung up
    assert ready == (200, {"ready": True, "reason": "listening"}), ready  # not draining
    assert "hung up from the console" not in bridge.log.split("http: refused", 1)[0]
    for route in ROUTES:  # every route was reached from the page, and refused for its Origin
        assert (route, "foreign_origin") in refused, (route, refused)
    assert {reason for _, reason in refused} == {"foreign_origin"}, refused
    assert hangup == 202 and placed == 202 and drained == 202 and invited


def test_the_console_signs_in_with_a_cookie_never_a_url(start_bridge, http_port: int, tmp_path: Path) -> None:
    token = "console-t0ken-7f3a"
    bridge = start_bridge(
        "--http",
        f"127.0.0.1:{http_port}",
        "--http-token-env",
        "PARLORA_TEST_TOKEN",
        env={"PARLORA_TEST_TOKEN": token},
    )
    base = f"http://127.0.0.1:{http_port}"
    assert _get(f"{base}/calls?token={token}")[0] == 400
    driver = chromium(tmp_path / "profile")
    try:
        driver.get(base + "/")
        wait_until(lambda: driver.find_element("id", "sign-in").is_displayed(), 10, "the sign-in form")
        driver.find_element("id", "token").send_keys("wrong")
        driver.find_element("css selector", "#sign-in button").click()
        wait_until(lambda: "refused" in driver.find_element("id", "sign-in-error").text, 5, "a refusal")
        driver.find_element("id", "token").send_keys(token)
        driver.find_element("css selector", "#sign-in button").click()
        wait_until(lambda: driver.find_element("id", "feed-state").text == "live", 10, "the event feed")
        assert not driver.find_element("id", "sign-in").is_displayed()
        cookies = driver.get_cookies()
        assert [(c["name"], c["httpOnly"], c.get("sameSite")) for c in cookies] == [
            ("parlora_console", True, "Strict")
        ], cookies
        assert token not in cookies[0]["value"] and driver.execute_script("return document.cookie") == ""
        assert token not in driver.current_url
        driver.get(base + "/")  # a reload keeps the session
        wait_until(
            lambda: driver.find_element("id", "feed-state").text == "live", 10, "the feed after a reload"
        )
    finally:
        driver.quit()
    assert token not in bridge.log
