"""Live: `serve --config FILE` on loopback answers SIPp calls by the file's routes (the command line's
--sip/--rtp-port over the file's listeners), and refuses a number no route matches with 404."""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import peers

from tests.support.ops_live import _stream_in_background

CONFIG = """
[listeners]
sip_udp = "127.0.0.1:9"          # overridden by the test's --sip: a call here would never arrive
[defaults]
provider = "echo"
instructions = "You are the test line."
[[routes]]
name = "lobby"
number = "bridge"
instructions = "You answer the lobby."
greeting = "Say: welcome to the lobby."
"""


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "bridge.toml"
    path.write_text(CONFIG)
    return path


def test_serve_config_routes_a_sipp_call_and_refuses_an_unrouted_number(
    start_bridge, utterance, tmp_path: Path
) -> None:
    bridge = start_bridge("--config", str(_config(tmp_path)))
    workdir = tmp_path / "sipp"
    workdir.mkdir()
    shutil.copy(peers.make_ulaw(utterance.path, tmp_path / "speech.ul"), workdir / "speech.ul")
    result = peers.run_sipp(
        "uac_stream", bridge.sip_port, workdir=workdir, timeout=40, extra_args=["-d", "3000"]
    )
    assert result.count("ANSWERED") == 1 and result.count("CLOSED") == 1, result.logs
    bridge.wait_for(r"call call-1: route lobby")
    bridge.wait_for(r"call call-1: greeting asked of the model")
    bridge.wait_for(r"call call-1 ended after .* by caller")
    refused = peers.run_sipp(
        "uac_busy", bridge.sip_port, service="nobody", workdir=tmp_path / "sipp-404", timeout=30
    )
    assert [line.split()[-1] for line in refused.logs] == ["404"], refused.logs
    bridge.wait_for(r"call call-2: refused 404: no route for the called number 'nobody'")


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _sample(text: str, name: str) -> float:
    """The value of one sample line of the Prometheus text (`name` with its labels), 0 when absent."""
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_metrics_move_during_and_after_a_live_call(start_bridge, utterance, tmp_path: Path) -> None:
    http_port = peers.free_udp_port(also_tcp=True)
    bridge = start_bridge("--config", str(_config(tmp_path)), "--http", f"127.0.0.1:{http_port}")
    base = f"http://127.0.0.1:{http_port}"
    assert _get(base + "/healthz")[0] == 200
    assert _get(base + "/readyz") == (200, '{"ready": true, "reason": "listening"}')
    before = _get(base + "/metrics")[1]
    assert _sample(before, 'parlora_calls_total{outcome="completed",route="lobby"}') == 0
    workdir = tmp_path / "sipp"
    workdir.mkdir()
    shutil.copy(peers.make_ulaw(utterance.path, tmp_path / "speech.ul"), workdir / "speech.ul")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(
            peers.run_sipp,
            "uac_stream",
            bridge.sip_port,
            workdir=workdir,
            timeout=40,
            extra_args=["-d", "4000"],
        )
        bridge.wait_for(r"call call-1 media: PCMU/8000", timeout=20)
        during = _get(base + "/metrics")[1]
        result = call.result(timeout=60)
    assert result.count("ANSWERED") == 1, result.logs
    assert _sample(during, 'parlora_calls_active{route="lobby"}') == 1
    bridge.wait_for(r"call call-1 ended after")
    # The call is counted as ended once the application has been told (call_ended, ended): soon after that line.
    deadline = time.monotonic() + 15
    while True:
        after = _get(base + "/metrics")[1]
        if _sample(after, 'parlora_calls_active{route="lobby"}') == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert _sample(after, 'parlora_calls_active{route="lobby"}') == 0
    assert _sample(after, 'parlora_calls_total{outcome="completed",route="lobby"}') == 1
    # at least the INVITE's; the engine also counts its 200 retransmissions (a late ACK under load) and others
    assert _sample(after, 'parlora_sip_responses_sent_total{code="200"}') >= 1
    assert _sample(after, 'parlora_rtp_packets_total{direction="in"}') > 100  # 4 s of 20 ms packets
    assert _sample(after, 'parlora_rtp_packets_total{direction="out"}') > 0


def test_json_logs_parse_and_never_carry_the_provider_key(
    start_bridge, start_fake, utterance, tmp_path: Path
) -> None:
    fake = start_fake("openai-live")
    key = "sk-test-9f8e7d6c5b4a-do-not-log"
    bridge = start_bridge(
        "--config",
        str(_config(tmp_path)),
        "--log-format",
        "json",
        *fake.bridge_args("openai-live"),
        "--log-level",
        "debug",
        env={"OPENAI_API_KEY": key},
    )
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        result = _stream_in_background(pool, bridge, utterance, tmp_path / "sipp", 3.0).result(timeout=60)
    assert result.count("ANSWERED") == 1, result.logs
    bridge.wait_for(r"call call-1 ended after")
    assert bridge.stop() == 0
    log = bridge.log
    assert key not in log
    lines = [json.loads(line) for line in log.splitlines() if line.strip()]
    assert len(lines) > 5
    assert all({"time", "level", "logger", "message", "event"} <= line.keys() for line in lines)
    ended = [line for line in lines if line["message"].startswith("call call-1 ended after")]
    assert len(ended) == 1 and ended[0]["call_id"] == "call-1"
    # The SIP Call-ID (SIPp's: N-PID@ADDRESS) and the config route ride along once known.
    assert ended[0]["route"] == "lobby" and "@127.0.0.1" in ended[0]["sip_call_id"], ended[0]
    about = [line for line in lines if line.get("call_id") == "call-1"]
    assert about and all(line["sip_call_id"] == ended[0]["sip_call_id"] for line in about), about


def test_sigterm_drains_live_calls_then_exits_zero(start_bridge, utterance, tmp_path: Path) -> None:
    http_port = peers.free_udp_port(also_tcp=True)
    bridge = start_bridge("--provider", "echo", "--drain-timeout", "30", "--http", f"127.0.0.1:{http_port}")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = _stream_in_background(pool, bridge, utterance, tmp_path / "sipp", 5.0)
        bridge.wait_for(r"call call-1 media: PCMU/8000", timeout=20)
        bridge.proc.proc.send_signal(signal.SIGTERM)
        bridge.wait_for(r"draining: refusing new calls; 1 live")
        options = peers.run_sipp("uac_options", bridge.sip_port, workdir=tmp_path / "options", timeout=20)
        ready = _get(f"http://127.0.0.1:{http_port}/readyz")
        result = call.result(timeout=60)
    assert options.logs == ["OPTIONS_ANSWERED 503"], options.logs
    assert ready == (503, '{"ready": false, "reason": "draining"}')
    assert result.count("ANSWERED") == 1 and result.count("CLOSED") == 1, result.logs  # the caller hung up
    assert bridge.proc.wait(timeout=20) == 0
    assert re.search(r"call call-1 ended after .* by caller", bridge.log)
    assert "stopping (calls finished; 0 live calls hung up)" in bridge.log


def test_drain_timeout_hangs_up_the_rest(start_bridge, utterance, tmp_path: Path) -> None:
    bridge = start_bridge("--provider", "echo", "--drain-timeout", "1")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = _stream_in_background(pool, bridge, utterance, tmp_path / "sipp", 20.0)
        bridge.wait_for(r"call call-1 media: PCMU/8000", timeout=20)
        bridge.proc.proc.send_signal(signal.SIGTERM)
        assert bridge.proc.wait(timeout=20) == 0
        result = call.result(timeout=60)
    assert result.count("ANSWERED") == 1, result.logs
    log = bridge.log
    assert "drain timeout: 1 live call(s) get a goodbye, then BYE" in log, log[-3000:]
    assert "stopping (drain timeout; 0 live calls hung up)" in log, log[-3000:]
    # The goodbye was played (the echo model answers the caller's utterance), then the bridge sent BYE.
    ended = re.search(
        r"call call-1 ended after ([\d.]+) s by \w+ \(drain timeout: the bridge is shutting down\)", log
    )
    assert ended and float(ended.group(1)) < 15, log[-3000:]


def test_second_sigterm_ends_at_once(start_bridge, utterance, tmp_path: Path) -> None:
    bridge = start_bridge("--provider", "echo", "--drain-timeout", "60")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = _stream_in_background(pool, bridge, utterance, tmp_path / "sipp", 20.0)
        bridge.wait_for(r"call call-1 media: PCMU/8000", timeout=20)
        bridge.proc.proc.send_signal(signal.SIGTERM)
        bridge.wait_for(r"draining: refusing new calls")
        bridge.proc.proc.send_signal(signal.SIGTERM)
        assert bridge.proc.wait(timeout=20) == 0
        call.result(timeout=60)
    assert "stopping (second signal; 1 live calls hung up)" in bridge.log


def _post(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=b"", method="POST")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_post_drain_drains_like_sigterm_then_exits_zero(start_bridge, utterance, tmp_path: Path) -> None:
    http_port = peers.free_udp_port(also_tcp=True)
    token = "drain-token-5c1f"
    bridge = start_bridge(
        "--provider",
        "echo",
        "--drain-timeout",
        "30",
        "--http",
        f"127.0.0.1:{http_port}",
        "--http-token-env",
        "PARLORA_HTTP_TOKEN",
        env={"PARLORA_HTTP_TOKEN": token},
    )
    base = f"http://127.0.0.1:{http_port}"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = _stream_in_background(pool, bridge, utterance, tmp_path / "sipp", 5.0)
        bridge.wait_for(r"call call-1 media: PCMU/8000", timeout=20)
        refused = _post(base + "/drain")  # the token is required, as for every control route
        assert bridge.proc.running() and "draining" not in bridge.log
        status, body = _post(base + "/drain", token)
        bridge.wait_for(r"draining: refusing new calls; 1 live")
        again = _post(base + "/drain", token)  # harmless: never an end at once
        options = peers.run_sipp("uac_options", bridge.sip_port, workdir=tmp_path / "options", timeout=20)
        invite = peers.run_sipp("uac_busy", bridge.sip_port, workdir=tmp_path / "invite", timeout=20)
        ready = _get(f"{base}/readyz", token)
        result = call.result(timeout=60)
    assert refused[0] == 401, refused
    assert status == 202 and json.loads(body) == {"draining": True, "live_calls": 1, "already": False}, body
    assert again[0] == 202 and json.loads(again[1])["already"] is True, again
    assert options.logs == ["OPTIONS_ANSWERED 503"], options.logs
    assert [line.split()[-1] for line in invite.logs] == ["503"], invite.logs
    assert ready == (503, '{"ready": false, "reason": "draining"}')
    assert result.count("ANSWERED") == 1 and result.count("CLOSED") == 1, result.logs  # the caller hung up
    assert bridge.proc.wait(timeout=20) == 0
    assert re.search(r"call call-1 ended after .* by caller", bridge.log)
    assert "stopping (calls finished; 0 live calls hung up)" in bridge.log


ROUTED = """
[defaults]
provider = "echo"
[providers.openai-realtime]
key_env = "TEST_REALTIME_KEY"
url = "{url}"
[[routes]]
name = "realtime-line"
number = "bridge"
provider = "openai-realtime"
[[routes]]
name = "the-rest"
"""


def test_a_route_with_its_own_provider_connects_there(
    start_bridge, start_fake, utterance, tmp_path: Path
) -> None:
    fake = start_fake("openai-realtime")
    config = tmp_path / "routed.toml"
    config.write_text(ROUTED.format(url=fake.url))
    bridge = start_bridge("--config", str(config), env={"TEST_REALTIME_KEY": "sk-route-test-123456"})
    bridge.wait_for(r"provider openai-realtime for route\(s\) realtime-line at ws://127\.0\.0\.1")
    workdir = tmp_path / "sipp"
    workdir.mkdir()
    shutil.copy(peers.make_ulaw(utterance.path, tmp_path / "speech.ul"), workdir / "speech.ul")
    routed = peers.run_sipp(
        "uac_stream", bridge.sip_port, workdir=workdir, timeout=40, extra_args=["-d", "2000"]
    )
    assert routed.count("ANSWERED") == 1, routed.logs
    bridge.wait_for(r"call call-1 ended after")
    frames = fake.record.read_text().count("\n")
    assert frames > 5, "the realtime fake never heard the routed call"
    other = peers.run_sipp(
        "uac_stream", bridge.sip_port, service="other", workdir=workdir, timeout=40, extra_args=["-d", "2000"]
    )
    assert other.count("ANSWERED") == 1, other.logs
    bridge.wait_for(r"call call-2 ended after")
    assert "call call-2: route the-rest" in bridge.log
    assert fake.record.read_text().count("\n") == frames  # the catch-all's call went to the embedded echo


def test_a_crash_prints_every_threads_python_stack(start_bridge) -> None:
    """A fatal signal (here SIGSEGV sent by hand, as a C extension's crash would raise it) leaves the stacks of
    the process's threads on stderr (faulthandler), so a crash in pjsua2 or PyAV under load can be placed."""
    bridge = start_bridge("--provider", "echo")
    bridge.wait_for(r"listening on udp")
    bridge.crash_expected = True
    bridge.proc.proc.send_signal(signal.SIGSEGV)
    assert bridge.proc.wait(timeout=10) == -signal.SIGSEGV
    bridge.proc.stop()  # joins the readers: all of stderr is in
    assert "Fatal Python error: Segmentation fault" in bridge.log, bridge.log[-2000:]
    assert re.search(r'File ".*bridge/cli/commands\.py", line \d+ in _run_server', bridge.log), bridge.log[
        -2000:
    ]
