"""Fixtures that run `parlora-bridge` as a real process on loopback, as an operator would."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import peers
import pytest

from rtp import speedups

BRIDGE = [sys.executable, "-m", "bridge"]
READY = re.compile(r"listening on udp 127\.0\.0\.1:(\d+)")

pytestmark = pytest.mark.integration

# The contract subset (DESIGN §11: echo, barge-in, recovery, rollover, transfer, DTMF, hang-ups) runs on both
# engines: a test that takes `bridge_engine` runs once per engine, and `start_bridge` (and `leg_driver`) pass
# `--engine` for it. Every other test runs on the default engine (sip.engine.DEFAULT_ENGINE, native).
CONTRACT_ENGINES = ("native", "pjsua2")


# tests/run.sh runs the suite on two workers (pytest-xdist), then these modules alone, one test at a time:
# each loads the machine enough (tens of calls, floods, mutated SIP at 800 a second, Chromium) to stall the
# bridges of the tests beside it (a pjsua2 rollover saw 152 ms RTP gaps beside them) and their floods' own
# rate figures. The live tests assert RTP continuity by sequence numbers and timestamps (peers.rtp_continuity),
# never by arrival gaps: those are measured in tests/bench/.
SERIAL_MODULES = frozenset(
    {
        "test_reliability_quick.py",
        "test_kamailio_scale.py",
        "test_hostile_quick.py",
        "test_rfc4475_live.py",
        "test_browser_channel.py",
        "test_console.py",
        "test_control_plane_browser.py",
    }
)


# The media paths a test that takes `bridge_media_path` runs on: see that fixture.
MEDIA_PATHS = ("compiled", "pure")
NATIVE_ALSO_PURE = pytest.mark.parametrize(
    ("bridge_engine", "bridge_media_path"),
    [*((engine, "compiled") for engine in CONTRACT_ENGINES), ("native", "pure")],
    ids=[*CONTRACT_ENGINES, "native-pure"],
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "contract: the call-leg contract subset, run on every SIP engine")


@pytest.fixture(params=CONTRACT_ENGINES)
def bridge_engine(request: pytest.FixtureRequest) -> str:
    """The SIP engine a contract test runs on (each test that takes it runs on both)."""
    return str(request.param)


@pytest.fixture(params=MEDIA_PATHS)
def bridge_media_path(request: pytest.FixtureRequest) -> str:
    """The media path (rtp.speedups: the compiled rtp/_speedups.c or the pure functions, the same answers bit
    for bit) a live test's bridge runs. A test that takes it runs once per path (ids [compiled], [pure]):
    `start_bridge` gives the bridge PARLORA_PURE_MEDIA=1 for the pure one (empty for the compiled one), then asks
    the bridge itself which path it runs (GET /sip's `media_path`, on an HTTP listener it adds when the test gave
    none) and fails the test if it is not the one asked for; [compiled] is skipped where the extension is not
    built. A contract test (it takes `bridge_engine` too) takes both through `NATIVE_ALSO_PURE`: ids [native] and
    [pjsua2] as before, and [native-pure] (pjsua2's RTP goes through pjmedia, not rtp.speedups).

    Which tests run on both: the cheap ones whose media crosses what the compiled path replaces (RTP parse and
    pack, the G.711 frame decoders, the stamped receive), one per kind: PCMU byte for byte from the provider to
    the caller (test_native_engine, 12.3 s), the caller's echo in A-law (test_engine_peers' baresip offering PCMA
    alone, 11.8 s: no live test called in A-law before), hold and resume by re-INVITE (test_native_engine's SIPp
    hold, 6.4 s), RFC 4733 DTMF in (test_engine_peers' baresip DTMF, 6.0 s) and SDES-SRTP (test_trunk_tls_srtp's
    baresip echo, 11.1 s). The echo through baresip allows a jitter-buffer slip of a stalled host; test_native_
    engine's SIPp echo, which allows none (every eighth of the utterance heard whole), stays on the compiled path:
    its pure run was the first live test of a loaded clean-clone run and met one 11 ms slip, which no path causes
    (the jitter buffer is the same Python on both). These pure runs and the A-law test's compiled one add about
    60 s of test time, spread over the parallel part's two workers by file: about 30 s of its wall time. Every other live test runs on the compiled path alone: the whole live suite twice would not
    fit the clean-clone run's 30 minutes (it takes about 25)."""
    return str(request.param)


def media_path_of(request: pytest.FixtureRequest) -> str | None:
    """The media path the requesting test asked for (`bridge_media_path`), or None (the bridge's own choice)."""
    if "bridge_media_path" not in request.fixturenames:
        return None
    return str(request.getfixturevalue("bridge_media_path"))


def engine_args(request: pytest.FixtureRequest) -> list[str]:
    """`--engine NAME` when the requesting test takes `bridge_engine`, else nothing (the default engine)."""
    if "bridge_engine" in request.fixturenames:
        return ["--engine", str(request.getfixturevalue("bridge_engine"))]
    return []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.fspath) and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)
        if "bridge_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.contract)  # `pytest -m contract`: the subset, on both engines
        if item.path.name in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)


@pytest.fixture(scope="session", autouse=True)
def _peers_installed() -> None:
    missing = [
        tool
        for tool in ("baresip", "sipp", "sox", "espeak-ng", "tshark", "chromium", "chromedriver", "svmap")
        if shutil.which(tool) is None
    ]
    if missing:
        pytest.fail(f"integration peers missing: {', '.join(missing)} (bash tests/run.sh installs them)")


class Bridge:
    """A running `parlora-bridge serve`; `stop()` sends SIGTERM and checks for a clean exit."""

    def __init__(self, proc: peers.ManagedProcess, sip_port: int, rtp_port: int) -> None:
        self.proc = proc
        self.sip_port = sip_port
        self.rtp_port = rtp_port  # the first call's RTP port
        self.crash_expected = False  # a test that crashes the bridge on purpose says so

    @property
    def log(self) -> str:
        return self.proc.stderr

    def wait_for(self, pattern: str, timeout: float = 15.0) -> re.Match[str]:
        return self.proc.wait_for(pattern, timeout)

    def stop(self) -> int | None:
        rc = self.proc.stop(term_timeout=15.0)
        assert "Assertion" not in self.log, self.log[-3000:]
        # A bridge that crashed during the test (a segfault in pjsua2's threads, say) fails it here, whatever
        # the test's own checks saw: SIGTERM and SIGKILL are the only signals a bridge may end by.
        if not self.crash_expected:
            assert "Fatal Python error" not in self.log and rc not in _CRASHES, (rc, self.log[-3000:])
        return rc


_CRASHES = {-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGBUS, -signal.SIGFPE, -signal.SIGILL}


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@pytest.fixture
def start_bridge(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Bridge]]:
    """Start `serve` with extra CLI args; every bridge started is stopped (and checked) at teardown."""
    started: list[Bridge] = []
    engine = engine_args(request)
    media_path = media_path_of(request)
    if engine[1:] == ["pjsua2"]:
        media_path = None  # pjmedia carries pjsua2's RTP: rtp.speedups is not on its path
    if media_path == "compiled" and speedups.compiled is None:
        pytest.skip("the compiled media path is not built here (rtp/_speedups.c)")

    def start(*args: str, env: dict[str, str] | None = None) -> Bridge:
        sip_port = peers.free_udp_port()
        rtp_port = peers.free_rtp_port()  # even: the first call takes exactly this port on either engine
        http: list[str] = []
        if media_path is not None:
            env = {**(env or {}), speedups.PURE_ENV: "1" if media_path == "pure" else ""}
            if "--http" not in args:
                http = ["--http", f"127.0.0.1:{peers.free_udp_port(also_tcp=True)}"]
        # --drain-timeout 0: a test that stops its bridge mid-call gets today's hang-up at once; a test of the
        # drain passes its own value after it (click takes the last).
        argv = [
            *BRIDGE,
            "serve",
            "--sip",
            f"127.0.0.1:{sip_port}",
            "--rtp-port",
            str(rtp_port),
            *engine,
            "--drain-timeout",
            "0",
            *http,
            *args,
            "--log-level",
            os.environ.get("PARLORA_TEST_LOG_LEVEL", "info"),
        ]
        proc = peers.ManagedProcess(argv, cwd=tmp_path, env=_clean_env(env), name="parlora-bridge")
        bridge = Bridge(proc, sip_port, rtp_port)
        started.append(bridge)
        bridge.wait_for(READY.pattern, timeout=20)
        if media_path is not None:
            listener = [*http, *args][[*http, *args].index("--http") + 1]
            with urllib.request.urlopen(f"http://{listener}/sip", timeout=5) as answer:
                runs = json.loads(answer.read()).get("media_path")
            assert runs == media_path, f"asked for the {media_path} media path, the bridge runs {runs}"
        return bridge

    yield start
    for bridge in started:
        bridge.stop()


class Fake:
    """A running `parlora-bridge fake-provider`: its URL, its record file, and (TLS fakes) its certificate."""

    def __init__(self, proc: peers.ManagedProcess, url: str, record: Path, cert: str | None) -> None:
        self.proc, self.url, self.record, self.cert = proc, url, record, cert

    def __iter__(self) -> Iterator[object]:  # (proc, url, record), as the first tests unpack it
        return iter((self.proc, self.url, self.record))

    def bridge_args(self, protocol: str) -> list[str]:
        args = ["--provider", protocol, "--provider-url", self.url]
        return args + ["--provider-ca", self.cert] if self.cert else args


@pytest.fixture
def start_fake(tmp_path: Path) -> Iterator[Callable[..., Fake]]:
    """Start `parlora-bridge fake-provider` as its own process."""
    started: list[peers.ManagedProcess] = []

    def start(protocol: str = "openai-live", *extra: str) -> Fake:
        port = peers.free_udp_port(also_tcp=True)
        record = tmp_path / f"fake-{port}.jsonl"
        argv = [
            *BRIDGE,
            "fake-provider",
            "--protocol",
            protocol,
            "--listen",
            f"127.0.0.1:{port}",
            "--record",
            str(record),
            *extra,
        ]
        proc = peers.ManagedProcess(argv, cwd=tmp_path, env=_clean_env(), name="fake-provider")
        started.append(proc)
        match = proc.wait_for(r"listening on (wss?://\S+)", timeout=20)
        cert = re.search(r"generated a self-signed TLS pair: cert (\S+)", proc.stdout + proc.stderr)
        url = match.group(1).replace("127.0.0.1", "localhost") if cert else match.group(1)
        return Fake(proc, url, record, cert.group(1) if cert else None)

    yield start
    for proc in started:
        proc.stop(term_timeout=5.0)


@pytest.fixture(scope="session")
def utterance(tmp_path_factory: pytest.TempPathFactory) -> peers.Utterance:
    """A spoken sentence between silences, long enough after it for the echo to come back."""
    path = tmp_path_factory.mktemp("audio") / "utterance.wav"
    # One sentence: a full stop makes a pause long enough for a VAD to split it into two turns.
    return peers.make_utterance(path, "Hello bridge, please say this sentence back to me", tail_silence_s=4.5)


class Capture:
    """A capture on loopback, limited by a capture filter to the project's own traffic, read with tshark.

    dumpcap (tshark's package's) writes it (what `tshark -w` runs underneath): it is capturing within 0.05 s for 0.01 s of CPU,
    where tshark first loads every dissector (2 s to "Capturing on" and 0.7 s of CPU, measured beside a loaded
    suite on 7 December 2026) only to hand the capture to dumpcap."""

    def __init__(self, path: Path, capture_filter: str) -> None:
        self.path = path
        self._read: dict[int, list[list[str]]] = {}
        self.proc = peers.ManagedProcess(
            ["dumpcap", "-i", "lo", "-f", capture_filter, "-w", str(path)], name="dumpcap"
        )
        self.proc.wait_for(r"Capturing on", timeout=15)

    def stop(self) -> None:
        self.proc.stop(term_timeout=5.0)

    def _packets(self, port: int) -> list[list[str]]:
        """Each UDP packet sent from `port`, in capture order: its capture time, then its RTP sequence number,
        timestamp, SSRC and payload (empty where it does not parse as RTP). One tshark read per port of a
        stopped capture, for the three below: tshark takes about a second to load its dissectors."""
        if port in self._read:
            return self._read[port]
        fields = ("frame.time_epoch", "rtp.seq", "rtp.timestamp", "rtp.ssrc", "rtp.payload")
        out = peers._run_bounded(
            ["tshark", "-r", str(self.path), "-d", f"udp.port=={port},rtp", "-Y", f"udp.srcport=={port}"]
            + ["-T", "fields", "-E", "separator=,", *(arg for f in fields for arg in ("-e", f))],
            60,
        )
        rows = [line.split(",") for line in out.stdout.split() if line]
        if not self.proc.running():
            self._read[port] = rows
        return rows

    def packet_times(self, port: int) -> list[float]:
        """Capture times (s) of the UDP packets sent from `port`."""
        return [float(time) for time, *_ in self._packets(port)]

    def rtp_headers(self, port: int) -> list[tuple[int, int, int]]:
        """(sequence number, timestamp, SSRC) of the RTP packets sent from `port`, in capture order."""
        return [(int(seq), int(ts), int(ssrc, 0)) for _, seq, ts, ssrc, _ in self._packets(port) if seq]

    def rtp_payloads(self, port: int) -> list[bytes]:
        """Payloads of the RTP packets sent from `port`, in capture order."""
        return [
            bytes.fromhex(payload.replace(":", ""))
            for _, seq, _, _, payload in self._packets(port)
            if seq and payload
        ]


@pytest.fixture
def capture(tmp_path: Path) -> Iterator[Callable[[str], Capture]]:
    started: list[Capture] = []

    def start(capture_filter: str) -> Capture:
        cap = Capture(tmp_path / f"capture-{len(started)}.pcapng", capture_filter)
        started.append(cap)
        return cap

    yield start
    for cap in started:
        cap.stop()
