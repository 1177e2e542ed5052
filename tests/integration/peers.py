"""Integration-test harness: real SIP peers (baresip, SIPp) driven on loopback.

Everything here talks to 127.0.0.1 only. Every subprocess is owned by a
:class:`ManagedProcess` (tracked by PID, started in its own session, and always
terminated/killed in a ``finally``); every wait is bounded by a timeout; every
file lands under a directory the caller supplies (e.g. pytest's ``tmp_path``).

Public API
----------
Audio:     :func:`make_utterance` -> :class:`Utterance`, :func:`make_ulaw`,
           :func:`read_wav`, :func:`write_wav`
Analysis:  :func:`normalized_xcorr`, :func:`first_onset`, :func:`rms_dbfs`
Processes: :class:`ManagedProcess`, :func:`wait_for_log`, :func:`free_udp_port`
Peers:     :class:`BaresipCaller` -> :class:`BaresipResult`,
           :func:`run_sipp` -> :class:`SippResult`, :data:`SCENARIOS`

Measured facts (baresip 1.0.0, SIPp 3.6.1, pjsua2 2.15.1 echo answerer):

* sndfile dumps are *packet-indexed*, not wall-clock: ``enc.wav`` sample 0 is
  the first sample of the first RTP packet baresip sent, ``dec.wav`` sample 0
  the first sample of the first RTP packet it received. See
  :class:`BaresipCaller` for the numbers.
* baresip does NOT exit when the call ends; :class:`BaresipCaller` waits for
  the "terminated"/"session closed" line and then quits it itself.
* SIPp ``rtp_stream`` sends files verbatim (RIFF header included): give it
  the headerless ``.ul`` from :func:`make_ulaw`.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

LOOPBACK = "127.0.0.1"
SAMPLE_RATE = 8000
SCENARIOS = Path(__file__).resolve().parent / "scenarios"
DEFAULT_TEXT = "Hello bridge. This is a test of the audio path. One, two, three, four, five."

__all__ = [
    "LOOPBACK",
    "RtpContinuity",
    "rtp_continuity",
    "inner_only",
    "rerun_in_netns",
    "SAMPLE_RATE",
    "SCENARIOS",
    "BaresipCaller",
    "BaresipResult",
    "LogLine",
    "ManagedProcess",
    "PeerError",
    "SippResult",
    "Utterance",
    "first_onset",
    "free_udp_port",
    "make_ulaw",
    "make_utterance",
    "normalized_xcorr",
    "read_wav",
    "rms_dbfs",
    "run_sipp",
    "wait_for_log",
    "write_wav",
]


class PeerError(RuntimeError):
    """A peer process failed in a way the harness could not recover from."""


# --------------------------------------------------------------------------
# Ports
# --------------------------------------------------------------------------


def _bindable(port: int, kind: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, kind) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def rerun_in_netns(
    module: Path,
    marker_env: str,
    passed: int,
    *,
    setup: str = "",
    basetemp: str | None = None,
    timeout: float = 300,
) -> None:
    """Run `module`'s tests named "inner" again inside a private network namespace (`unshare --net`, loopback
    up, then `setup`'s shell commands), with `marker_env`=1 marking the inner run (`inner_only`), and assert
    that `passed` of them passed; pytest.skip where a namespace cannot be made (root, unshare and ip are
    needed). Hostile or outside-addressed traffic stays inside it."""

    import pytest

    if os.environ.get(marker_env):
        pytest.skip("this is the inner run")
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs root, unshare and ip for a private network namespace")
    script = (
        f"ip link set lo up && {setup + ' && ' if setup else ''}exec {sys.executable} -m pytest -q "
        f"-p no:cacheprovider -s {module} -k inner" + (f" --basetemp {basetemp}" if basetemp else "")
    )
    proc = subprocess.run(
        ["unshare", "--net", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=module.parents[2],
        env={**os.environ, marker_env: "1"},
    )
    print(proc.stdout[-4000:])
    assert proc.returncode == 0, f"{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert re.search(rf"\b{passed} passed\b", proc.stdout), proc.stdout[-3000:]


def inner_only(marker_env: str) -> None:
    """Skip unless this is the inner run of `rerun_in_netns`."""
    import pytest

    if not os.environ.get(marker_env):
        pytest.skip("runs inside the outer test's network namespace")


def free_udp_port(*, also_tcp: bool = False, tcp_extra: Sequence[int] = (), attempts: int = 200) -> int:
    """Return a UDP port on 127.0.0.1 that is free right now.

    ``also_tcp`` also requires TCP on the same port; ``tcp_extra`` lists
    offsets (e.g. ``(1,)``) whose TCP ports must be free too. baresip needs
    ``also_tcp=True, tcp_extra=(1,)``: it listens UDP+TCP on ``sip_listen`` and
    TLS (TCP) on port+1. Inherently racy (the port is released before the
    peer binds it); the peers retry where it matters.
    """
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((LOOPBACK, 0))
            port = s.getsockname()[1]
        if port + max(tcp_extra, default=0) > 65535:
            continue
        if also_tcp and not _bindable(port, socket.SOCK_STREAM):
            continue
        if all(_bindable(port + off, socket.SOCK_STREAM) for off in tcp_extra):
            return port
    raise PeerError("no free loopback port found")


def _free_udp_port_pair(step: int = 2, attempts: int = 200) -> int:
    """A free UDP port ``p`` with ``p + step`` free as well (RTP media ports)."""
    for _ in range(attempts):
        p = free_udp_port()
        if p + step <= 65535 and _bindable(p + step, socket.SOCK_DGRAM):
            return p
    raise PeerError("no free loopback UDP port pair found")


def free_rtp_port(attempts: int = 200) -> int:
    """A free even UDP port ``p`` (RTP) with ``p + 1`` (its RTCP) and the next pair ``p + 2``/``p + 3`` free
    too: engines take RTP on even ports (RFC 3550 §11), so the first call's port is exactly ``p``."""
    for _ in range(attempts):
        p = free_udp_port() & ~1
        if p >= 1024 and p + 3 <= 65535 and all(_bindable(p + off, socket.SOCK_DGRAM) for off in range(4)):
            return p
    raise PeerError("no free loopback even UDP port run found")


# --------------------------------------------------------------------------
# Processes and logs
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class LogLine:
    """One line of process output: monotonic time, 'stdout'/'stderr', text."""

    t: float
    stream: str
    text: str


class _OutputCollector:
    """Reader threads that drain a Popen's stdout/stderr into a line list.

    Lines are split on ``\\n`` and ``\\r`` (baresip's status line uses ``\\r``)
    and decoded as UTF-8 with replacement. Pipes are always drained, so the
    child never blocks on a full pipe.
    """

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[LogLine] = []
        self.cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        for name in ("stdout", "stderr"):
            pipe = getattr(proc, name)
            if pipe is None:
                continue
            t = threading.Thread(
                target=self._drain, args=(pipe, name), name=f"drain-{proc.pid}-{name}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def _add(self, stream: str, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace")
        if not text.strip():
            return
        with self.cond:
            self.lines.append(LogLine(time.monotonic(), stream, text))
            self.cond.notify_all()

    def _drain(self, pipe, stream: str) -> None:
        buf = b""
        try:
            while True:
                chunk = pipe.read1(65536) if hasattr(pipe, "read1") else pipe.read(65536)
                if not chunk:
                    break
                if isinstance(chunk, str):  # Popen(..., text=True)
                    chunk = chunk.encode("utf-8", "replace")
                buf += chunk
                parts = re.split(rb"[\r\n]", buf)
                buf = parts.pop()
                for p in parts:
                    self._add(stream, p)
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError, ValueError):
                pipe.close()  # at EOF: else each process's two pipes stay open as long as the suite runs
            if buf:
                self._add(stream, buf)
            with self.cond:
                self.cond.notify_all()

    @property
    def eof(self) -> bool:
        return not any(t.is_alive() for t in self._threads)

    def join(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))

    def text(self, stream: str | None = None) -> str:
        with self.cond:
            return "\n".join(ln.text for ln in self.lines if stream is None or ln.stream == stream)

    def wait_for(
        self, pattern: str | re.Pattern[str], timeout: float, since: int = 0, stream: str | None = None
    ) -> re.Match[str]:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        idx = since
        with self.cond:
            while True:
                while idx < len(self.lines):
                    ln = self.lines[idx]
                    idx += 1
                    if stream is None or ln.stream == stream:
                        m = rx.search(ln.text)
                        if m:
                            return m
                if self.eof and self.proc.poll() is not None:
                    raise PeerError(
                        f"pid {self.proc.pid} exited (rc={self.proc.returncode}) without "
                        f"printing /{rx.pattern}/; last output:\n{_tail(self.lines)}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"pid {self.proc.pid}: /{rx.pattern}/ not seen within {timeout:.1f} s;"
                        f" last output:\n{_tail(self.lines)}"
                    )
                self.cond.wait(min(remaining, 0.2))


def _tail(lines: Sequence[LogLine], n: int = 25) -> str:
    return "\n".join(f"[{ln.stream}] {ln.text}" for ln in list(lines)[-n:])


_COLLECTORS: weakref.WeakKeyDictionary[subprocess.Popen, _OutputCollector] = weakref.WeakKeyDictionary()
_COLLECTORS_LOCK = threading.Lock()


def _collector_for(proc: subprocess.Popen) -> _OutputCollector:
    with _COLLECTORS_LOCK:
        col = _COLLECTORS.get(proc)
        if col is None:
            if proc.stdout is None and proc.stderr is None:
                raise ValueError("Popen needs stdout and/or stderr=subprocess.PIPE")
            col = _COLLECTORS[proc] = _OutputCollector(proc)
        return col


_LIVE: weakref.WeakSet[ManagedProcess] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    """Safety net: stop any ManagedProcess still running at interpreter exit."""
    for p in list(_LIVE):
        with contextlib.suppress(Exception):
            p.stop(term_timeout=1.0, kill_timeout=1.0)


class ManagedProcess:
    """A subprocess tracked by PID whose output is collected by reader threads.

    Started in its own session (process group = its PID), so :meth:`stop`
    signals the child and anything it spawned, and only them. Use as a context
    manager (or call :meth:`stop` in a ``finally``)::

        with ManagedProcess([sys.executable, "-m", "bridge", ...], cwd=tmp_path) as bridge:
            m = bridge.wait_for(r"listening on udp 127\\.0\\.0\\.1:(\\d+)", timeout=15)
            port = int(m.group(1))

    ``stdin_pipe=True`` gives a writable stdin (:meth:`send`); otherwise stdin
    is ``/dev/null``.
    """

    def __init__(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        stdin_pipe: bool = False,
        name: str | None = None,
    ) -> None:
        self.argv = [os.fspath(a) for a in argv]
        self.name = name or Path(self.argv[0]).name
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv,
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        _LIVE.add(self)
        self._out = _collector_for(self.proc)

    # -- output -----------------------------------------------------------
    @property
    def lines(self) -> list[LogLine]:
        """Snapshot of all output lines so far (both streams, in arrival order)."""
        with self._out.cond:
            return list(self._out.lines)

    def line_count(self) -> int:
        """Number of lines so far; pass as ``since=`` to only match newer lines."""
        with self._out.cond:
            return len(self._out.lines)

    @property
    def stdout(self) -> str:
        return self._out.text("stdout")

    @property
    def stderr(self) -> str:
        return self._out.text("stderr")

    def wait_for(
        self, pattern: str | re.Pattern[str], timeout: float, *, since: int = 0, stream: str | None = None
    ) -> re.Match[str]:
        """Block until a line (from ``since`` on) matches ``pattern`` (``re.search``).

        Raises ``TimeoutError`` after ``timeout`` s, or :class:`PeerError` if the
        process exits first. ``stream`` restricts to 'stdout' or 'stderr'.
        """
        return self._out.wait_for(pattern, timeout, since, stream)

    # -- lifecycle --------------------------------------------------------
    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def running(self) -> bool:
        return self.proc.poll() is None

    def send(self, text: str) -> bool:
        """Write ``text`` to stdin (needs ``stdin_pipe=True``); False if closed."""
        if self.proc.stdin is None:
            raise ValueError("process was started without stdin_pipe=True")
        try:
            self.proc.stdin.write(text.encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, ValueError, OSError):
            return False

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` s for exit; return the exit code or None."""
        try:
            return self.proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None

    def _signal(self, sig: int) -> None:
        # Signal the process group only while the leader is unreaped: its PID
        # (= PGID) cannot have been recycled, so this reaches only our processes.
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def stop(
        self, *, term_timeout: float = 3.0, kill_timeout: float = 3.0, term_signals: int = 1
    ) -> int | None:
        """Terminate (SIGTERM, ``term_signals`` times) and then SIGKILL if needed.

        Idempotent; returns the exit code (None only if even SIGKILL did not
        reap it within ``kill_timeout``). Closes pipes and joins reader threads.
        """
        try:
            for _ in range(max(1, term_signals)):
                if self.proc.poll() is not None:
                    break
                self._signal(signal.SIGTERM)
                self.wait(term_timeout / max(1, term_signals))
            if self.proc.poll() is None:
                self._signal(signal.SIGKILL)
                self.wait(kill_timeout)
        finally:
            if self.proc.stdin is not None:
                with contextlib.suppress(OSError, ValueError):
                    self.proc.stdin.close()
            self._out.join(2.0)
        return self.proc.poll()

    def __enter__(self) -> ManagedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<ManagedProcess {self.name} pid={self.pid} rc={self.proc.poll()}>"


def wait_for_log(
    source: ManagedProcess | subprocess.Popen | str | os.PathLike[str],
    pattern: str | re.Pattern[str],
    timeout: float,
    *,
    since: int = 0,
    poll_s: float = 0.05,
) -> re.Match[str]:
    """Wait until ``source`` outputs a line matching ``pattern`` (``re.search``).

    ``source`` may be a :class:`ManagedProcess`, a ``subprocess.Popen`` created
    with ``stdout``/``stderr=PIPE`` (reader threads are attached on first use
    and keep draining the pipes from then on: do not read them yourself), or a
    file path that is polled every ``poll_s`` s. ``since`` is a line index
    (processes) or byte offset (files). Raises ``TimeoutError`` on timeout and
    :class:`PeerError` if the process exits without printing it.
    """
    if isinstance(source, ManagedProcess):
        return source.wait_for(pattern, timeout, since=since)
    if isinstance(source, subprocess.Popen):
        return _collector_for(source).wait_for(pattern, timeout, since)
    rx = re.compile(pattern)
    path = Path(source)
    deadline = time.monotonic() + timeout
    offset, pending = since, b""
    while True:
        with contextlib.suppress(FileNotFoundError):
            with path.open("rb") as f:
                f.seek(offset)
                data = f.read()
            offset += len(data)
            pending += data
            parts = re.split(rb"[\r\n]", pending)
            pending = parts.pop()
            for p in parts:
                m = rx.search(p.decode("utf-8", "replace"))
                if m:
                    return m
            if pending:  # an unterminated last line may already match
                m = rx.search(pending.decode("utf-8", "replace"))
                if m:
                    return m
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{path}: /{rx.pattern}/ not seen within {timeout:.1f} s")
        time.sleep(poll_s)


def _run_bounded(
    argv: Sequence[str | os.PathLike[str]], timeout: float, cwd: str | os.PathLike[str] | None = None
) -> ManagedProcess:
    """Run a short tool to completion (bounded); raise PeerError on failure."""
    p = ManagedProcess(argv, cwd=cwd)
    try:
        rc = p.wait(timeout)
        if rc is None:
            raise PeerError(f"{p.name} did not finish within {timeout} s: {p.argv}")
        p._out.join(2.0)
        if rc != 0:
            raise PeerError(f"{p.name} failed rc={rc}: {p.argv}\n{p.stderr[-2000:]}")
        return p
    finally:
        p.stop()


# --------------------------------------------------------------------------
# WAV I/O
# --------------------------------------------------------------------------


def read_wav(path: str | os.PathLike[str]) -> tuple[int, np.ndarray]:
    """Read a 16-bit PCM WAV; return ``(rate, int16 array)``.

    Mono gives shape ``(n,)``, multi-channel ``(n, channels)``. Tolerates
    WAVE_FORMAT_EXTENSIBLE and unfinalised headers (data size 0 or larger than
    the file, as left by a killed writer): then everything after the ``data``
    chunk header is used.
    """
    raw = Path(path).read_bytes()
    if len(raw) < 12 or raw[:4] != b"RIFF" or raw[8:12] != b"WAVE":
        raise ValueError(f"{path}: not a RIFF/WAVE file")
    pos, fmt = 12, None
    while pos + 8 <= len(raw):
        cid, size = raw[pos : pos + 4], struct.unpack_from("<I", raw, pos + 4)[0]
        body = pos + 8
        if cid == b"fmt ":
            tag, ch, rate, _, _, bits = struct.unpack_from("<HHIIHH", raw, body)
            if tag == 0xFFFE and size >= 40:
                tag = struct.unpack_from("<H", raw, body + 24)[0]
            fmt = (tag, ch, rate, bits)
        elif cid == b"data":
            if fmt is None:
                raise ValueError(f"{path}: data chunk before fmt chunk")
            tag, ch, rate, bits = fmt
            if tag != 1 or bits != 16:
                raise ValueError(f"{path}: need 16-bit PCM, got format {tag}/{bits} bit")
            end = body + size if 0 < size <= len(raw) - body else len(raw)
            end -= (end - body) % (2 * ch)
            a = np.frombuffer(raw[body:end], dtype="<i2").astype(np.int16)
            return rate, (a if ch == 1 else a.reshape(-1, ch))
        pos = body + size + (size & 1)
    raise ValueError(f"{path}: no data chunk")


def wav_cues(path: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """A WAV's cue points as (sample offset, label), in cue order: the `cue ` chunk's points (RIFF, each 24
    bytes: id, position, "data", chunk start, block start, sample offset) named by the `LIST`/`adtl` chunk's
    `labl` sub-chunks (id, NUL-terminated text). No `cue ` chunk: an empty list."""
    raw = Path(path).read_bytes()
    offsets: dict[int, int] = {}
    labels: dict[int, str] = {}
    pos = 12
    while pos + 8 <= len(raw):
        cid, size = raw[pos : pos + 4], struct.unpack_from("<I", raw, pos + 4)[0]
        body = pos + 8
        if cid == b"cue ":
            for i in range(struct.unpack_from("<I", raw, body)[0]):
                point, *_, offset = struct.unpack_from("<II4sIII", raw, body + 4 + 24 * i)
                offsets[point] = offset
        elif cid == b"LIST" and raw[body : body + 4] == b"adtl":
            sub = body + 4
            while sub + 8 <= body + size:
                sid, ssize = raw[sub : sub + 4], struct.unpack_from("<I", raw, sub + 4)[0]
                if sid == b"labl":
                    point = struct.unpack_from("<I", raw, sub + 8)[0]
                    labels[point] = raw[sub + 12 : sub + 8 + ssize].split(b"\0", 1)[0].decode("ascii")
                sub += 8 + ssize + (ssize & 1)
        pos = body + size + (size & 1)
    return [(offsets[point], labels.get(point, "")) for point in sorted(offsets)]


def write_wav(path: str | os.PathLike[str], samples: np.ndarray, rate: int = SAMPLE_RATE) -> Path:
    """Write mono int16 samples as a canonical 16-bit PCM WAV."""
    import wave

    a = np.asarray(samples)
    if a.dtype != np.int16:
        a = np.clip(np.round(a), -32768, 32767).astype(np.int16)
    with wave.open(os.fspath(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(a.astype("<i2").tobytes())
    return Path(path)


# --------------------------------------------------------------------------
# Utterances (espeak-ng + sox)
# --------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Utterance:
    """A synthesized test utterance: 8 kHz mono s16 WAV.

    ``start``/``end`` are sample offsets of the speech within the file
    (``samples[start:end]`` is the speech; ``end`` is exclusive), measured from
    the generated audio as the first/last non-zero sample: the padding is
    digital zero (sox runs with ``-D``, no dither). ``start`` is therefore
    ``lead_silence_s * 8000`` plus espeak-ng's own few ms of leading silence
    (about 60 samples), and the speech may begin softly, so a loudness-based
    :func:`first_onset` lands somewhat later than ``start``.
    """

    path: Path
    samples: np.ndarray
    start: int
    end: int
    text: str
    rate: int = SAMPLE_RATE
    ulaw_path: Path | None = None

    @property
    def speech(self) -> np.ndarray:
        """The samples between ``start`` and ``end``."""
        return self.samples[self.start : self.end]

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.rate


def make_ulaw(
    wav_path: str | os.PathLike[str], ul_path: str | os.PathLike[str] | None = None, *, timeout: float = 30.0
) -> Path:
    """Convert a WAV to headerless 8 kHz mono µ-law (``.ul``) for SIPp ``rtp_stream``."""
    src = Path(wav_path)
    dst = Path(ul_path) if ul_path is not None else src.with_suffix(".ul")
    _run_bounded(
        ["sox", "-D", src, "-t", "raw", "-r", str(SAMPLE_RATE), "-c", "1", "-e", "u-law", "-b", "8", dst],
        timeout,
    )
    return dst


def make_utterance(
    path_wav: str | os.PathLike[str],
    text: str = DEFAULT_TEXT,
    *,
    lead_silence_s: float = 0.5,
    tail_silence_s: float = 4.0,
    voice: str | None = None,
    words_per_minute: int | None = None,
    ulaw: bool = False,
    timeout: float = 30.0,
) -> Utterance:
    """Synthesize ``text`` with espeak-ng into an 8 kHz mono s16 WAV at ``path_wav``.

    Layout: ``lead_silence_s`` of digital zero, the speech, ``tail_silence_s``
    of digital zero. Temporary files go next to ``path_wav``. With
    ``ulaw=True`` a headerless µ-law copy is written to ``path_wav`` with suffix
    ``.ul`` (``Utterance.ulaw_path``).
    """
    out = Path(path_wav)
    out.parent.mkdir(parents=True, exist_ok=True)
    txt = out.with_name(out.stem + ".espeak.txt")
    raw = out.with_name(out.stem + ".espeak.wav")
    txt.write_text(text, encoding="utf-8")
    argv: list[str | os.PathLike[str]] = ["espeak-ng", "-w", raw, "-f", txt]
    if voice:
        argv[1:1] = ["-v", voice]
    if words_per_minute:
        argv[1:1] = ["-s", str(words_per_minute)]
    try:
        _run_bounded(argv, timeout)
        _run_bounded(
            [
                "sox",
                "-D",
                raw,
                "-r",
                str(SAMPLE_RATE),
                "-c",
                "1",
                "-b",
                "16",
                "-e",
                "signed-integer",
                out,
                "pad",
                f"{lead_silence_s:.6f}",
                f"{tail_silence_s:.6f}",
            ],
            timeout,
        )
    finally:
        for p in (txt, raw):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    rate, samples = read_wav(out)
    if rate != SAMPLE_RATE or samples.ndim != 1:
        raise PeerError(f"{out}: unexpected format rate={rate} shape={samples.shape}")
    nz = np.flatnonzero(samples)
    if nz.size == 0:
        raise PeerError(f"{out}: espeak-ng produced silence for {text!r}")
    ul = make_ulaw(out, timeout=timeout) if ulaw else None
    return Utterance(
        path=out, samples=samples, start=int(nz[0]), end=int(nz[-1]) + 1, text=text, ulaw_path=ul
    )


# --------------------------------------------------------------------------
# Analysis
# --------------------------------------------------------------------------


def _as_float(x: np.ndarray) -> np.ndarray:
    a = np.asarray(x)
    if np.issubdtype(a.dtype, np.integer):
        return a.astype(np.float64) / 32768.0
    return a.astype(np.float64)


def normalized_xcorr(
    reference: np.ndarray, signal: np.ndarray, *, min_lag: int | None = None, max_lag: int | None = None
) -> tuple[float, int]:
    """Normalised cross-correlation via FFT; return ``(peak_value, lag_samples)``.

    The lag is defined by ``signal[n + lag] ~ reference[n]``: a positive lag
    means the reference shows up ``lag`` samples into ``signal`` (negative: the
    signal starts inside the reference). With ``r`` the mean-removed reference
    and ``s`` the overlapping signal span minus its own mean, the value at each
    lag is ``sum(r*s) / sqrt(sum(r_all**2) * sum(s**2))`` (a Pearson
    correlation, but normalised by the *whole* reference). So it lies in
    [-1, 1], is 1 for an exact scaled copy wherever it sits in a longer
    signal, ignores DC offsets, and is small for tiny edge overlaps (a partial
    overlap of a fraction f of the reference scores at most ~sqrt(f)).
    The peak is the value with the largest magnitude (sign kept). Lags whose
    signal span is (near-)constant score 0. ``min_lag``/``max_lag`` restrict
    the search. Integer input is treated like :func:`first_onset` does.
    """
    ref = _as_float(reference).ravel()
    sig = _as_float(signal).ravel()
    if ref.size == 0 or sig.size == 0:
        raise ValueError("empty input")
    ref = ref - ref.mean()
    sig = sig - sig.mean()
    ref_energy = float(np.dot(ref, ref))
    if ref_energy == 0.0:
        raise ValueError("reference is constant")
    n_ref, n_sig = ref.size, sig.size
    nfft = 1 << (n_ref + n_sig - 2).bit_length()
    corr = np.fft.irfft(np.fft.rfft(sig, nfft) * np.conj(np.fft.rfft(ref, nfft)), nfft)
    # corr[k] = sum_n sig[n + k] * ref[n]; negative lags wrap to the end.
    lags = np.arange(-(n_ref - 1), n_sig)
    dot = np.concatenate([corr[nfft - (n_ref - 1) :], corr[:n_sig]]) if n_ref > 1 else corr[:n_sig]
    # Overlap at lag k: ref[a:b] against sig[a+k:b+k].
    a = np.maximum(0, -lags)
    b = np.minimum(n_ref, n_sig - lags)
    length = (b - a).astype(np.float64)
    c_ref = np.concatenate([[0.0], np.cumsum(ref)])
    c_s1 = np.concatenate([[0.0], np.cumsum(sig)])
    c_s2 = np.concatenate([[0.0], np.cumsum(sig * sig)])
    s1 = c_s1[b + lags] - c_s1[a + lags]
    s2 = c_s2[b + lags] - c_s2[a + lags]
    win_var = np.maximum(s2 - s1 * s1 / length, 0.0)  # sum of (s - mean_w)^2
    num = dot - (s1 / length) * (c_ref[b] - c_ref[a])
    ok = win_var > 1e-9 * max(float(win_var.max()), ref_energy)
    if min_lag is not None:
        ok &= lags >= min_lag
    if max_lag is not None:
        ok &= lags <= max_lag
    if not ok.any():
        return 0.0, 0
    norm = np.zeros_like(num)
    norm[ok] = num[ok] / np.sqrt(win_var[ok] * ref_energy)
    i = int(np.argmax(np.abs(norm)))
    return float(np.clip(norm[i], -1.0, 1.0)), int(lags[i])


def _moving_mean_square(samples: np.ndarray, window: int) -> np.ndarray:
    x = _as_float(samples).ravel()
    if window < 1:
        raise ValueError("window must be >= 1")
    if x.size < window:
        return np.zeros(0)
    c = np.concatenate([[0.0], np.cumsum(x * x)])
    return (c[window:] - c[:-window]) / window


@dataclass(frozen=True)
class RtpContinuity:
    """What one RTP stream's headers say of its continuity (RFC 3550 §5.1), read without arrival times."""

    packets: int
    ssrcs: int  # distinct SSRCs: one for a stream that never restarted
    seq_breaks: (
        int  # steps of the sequence number other than +1 (mod 2^16): packets lost, reordered or resent
    )
    odd_steps: int  # timestamp steps that are not a positive whole number of frames
    skipped_frames: int  # frames the timestamps step over: slots the sender's media clock gave up (counted)

    @property
    def skipped_share(self) -> float:
        return self.skipped_frames / max(1, self.packets + self.skipped_frames)


def rtp_continuity(headers: Sequence[tuple[int, int, int]], frame: int = 160) -> RtpContinuity:
    """Continuity of a stream from its (seq, timestamp, SSRC) headers: consecutive sequence numbers and
    timestamps one frame apart, except where the sender skipped slots after a stall (the media clock serves at
    most two late slots and advances the timestamps over older ones: rtp/pacer.py)."""
    seq_breaks = odd_steps = skipped = 0
    for (s0, t0, _), (s1, t1, _) in itertools.pairwise(headers):
        seq_breaks += (s1 - s0) % 65536 != 1
        step = (t1 - t0) % (1 << 32)
        if step == 0 or step % frame:
            odd_steps += 1
        else:
            skipped += step // frame - 1
    return RtpContinuity(len(headers), len({h[2] for h in headers}), seq_breaks, odd_steps, skipped)


def heard_in_pieces(speech: np.ndarray, received: np.ndarray, pieces: int = 4) -> list[tuple[float, int]]:
    """Each of `pieces` equal parts of `speech` located in `received`: (peak, lag) per part.

    baresip's receive path can slip by a few ms mid-call (its own buffering, seen as one part arriving 10 ms
    off the others), which breaks a single whole-utterance correlation but not these."""
    n = len(speech) // pieces
    return [normalized_xcorr(speech[i * n : (i + 1) * n], received) for i in range(pieces)]


def first_onset(samples: np.ndarray, threshold_dbfs: float = -40.0, window: int = 160) -> int | None:
    """Index of the first ``window``-sample span whose RMS exceeds ``threshold_dbfs``.

    Returns the start index ``i`` of the first span ``samples[i:i+window]`` that
    is louder than the threshold (the sound starts somewhere inside it), or
    None if none is. Integer input is scaled by 1/32768 (0 dBFS = full-scale
    int16); float input is taken as already in [-1, 1].
    """
    ms = _moving_mean_square(samples, window)
    hits = np.flatnonzero(ms > 10.0 ** (threshold_dbfs / 10.0))
    return int(hits[0]) if hits.size else None


def rms_dbfs(samples: np.ndarray) -> float:
    """RMS level in dBFS (-inf for digital silence); same scaling as :func:`first_onset`."""
    x = _as_float(samples).ravel()
    if x.size == 0:
        return float("-inf")
    ms = float(np.mean(x * x))
    return 10.0 * np.log10(ms) if ms > 0 else float("-inf")


# --------------------------------------------------------------------------
# baresip
# --------------------------------------------------------------------------

_BS_ESTABLISHED = re.compile(r"Call established")
_BS_TERMINATED = re.compile(r"Call with \S+ terminated \(duration: (\d+) secs?\)")
_BS_CLOSED = re.compile(r"session closed: ([^\r\n]+)", re.MULTILINE)
_BS_ENDED = re.compile(_BS_TERMINATED.pattern + "|" + _BS_CLOSED.pattern)


@dataclass
class BaresipResult:
    """Outcome of one :class:`BaresipCaller` call.

    ``received``/``sent`` are the sndfile ``dump-*-dec.wav``/``dump-*-enc.wav``
    recordings (int16 at 8 kHz; empty if the call never got media).
    ``close_reason`` is baresip's "session closed: <reason>" text when the
    far end ended or refused the call (``"486 Busy Here"``; a BYE from the
    far end shows as ``"Connection reset by peer"``), else ``"terminated"``
    when baresip hung up itself (end of file, ``/hangup``, ``-t``, quit).
    ``hangup_by`` is ``"remote"``/``"caller"`` for established calls.
    ``end_of_file`` says aufile reached the end of the WAV (the normal
    caller-side BYE). ``timed_out``: the harness gave up waiting and quit it.
    """

    returncode: int | None
    established: bool
    closed: bool
    close_reason: str | None
    hangup_by: str | None
    end_of_file: bool
    timed_out: bool
    received: np.ndarray
    sent: np.ndarray
    received_path: Path | None
    sent_path: Path | None
    stdout: str
    stderr: str
    duration_s: int | None  # baresip's "terminated (duration: N secs)"
    elapsed_s: float  # process start -> call-end line (or -> stop if none)
    sip_port: int
    lines: list[LogLine] = field(default_factory=list, repr=False)


def _resampled(samples: np.ndarray, rate: int, to: int) -> np.ndarray:
    """`samples` at `to` Hz, by the bridge's own resampler (rtp/resample.py: a few samples late)."""
    from rtp.resample import Resampler

    resampler = Resampler(rate, to)
    out = resampler.process(samples.astype("<i2").tobytes()) + resampler.flush()
    return np.frombuffer(out, dtype="<i2").astype(np.int16)


class BaresipCaller:
    """One headless baresip 1.0.0 call from ``sip:caller@127.0.0.1`` (PCMU only, unless ``codecs`` names
    G722 or opus: its module is loaded, aufile gets a copy at the codec's rate, the dumps, 16 or 48 kHz then,
    are read at 8 kHz).

    Writes a config dir under ``workdir`` (``sip_listen``/``net_interface``
    127.0.0.1, ``audio_source aufile,<wav>``, ``audio_player aubridge``,
    modules stdio/g711/aufile/aubridge/sndfile + account/contact/menu,
    ``snd_path`` = ``workdir/rec``), dials the target, and by default waits for
    the call to end: baresip hangs up itself (sends BYE) when ``aufile`` reaches
    the end of the WAV ("audio error (0,end of file)"), so the WAV's length,
    including its tail silence, is the call length. baresip does *not* exit
    after the call; the harness then sends ``/quit`` on stdin, then SIGTERM
    twice (the first is graceful and may wait for pending transactions), then
    SIGKILL, all by PID.

    Timing of the sndfile dumps (measured against a pjsua2 echo answerer,
    tshark on ``lo``):

    * ``sent`` (enc.wav) is exactly the stream put on the wire: sample 0 is the
      first sample of the first RTP packet sent, which is sample 0 of the WAV
      (aufile starts at call setup; cross-correlation with the WAV 1.000 at
      lag 0, with the decoded uplink RTP 0.9999 at lag 0, same length). It
      runs 0.6-1.0 s past the WAV's end (zeros) until the hangup.
    * ``received`` (dec.wav) is exactly the decoded downlink RTP payload, one
      packet after another (== pcap payload to within the µ-law-zero offset):
      sample 0 is the first sample of the first packet received, and gaps in
      the RTP stream are NOT filled, so it is packet time, not wall-clock. The
      last ~5 packets (100 ms, still in the jitter buffer) are missing at the
      end. PCMU silence (0xFF) decodes to +2, not 0.
    * The two files therefore do NOT start at the same instant; they are offset
      by (first RTP received - first RTP sent): 3.5 ms with pjsua2, which
      sends RTP from the moment it answers. The echo of the utterance showed
      up in ``received`` at lag +200 samples (25 ms; correlation 0.9999) in
      every single-call run, +200 or +360 with 4-5 concurrent calls, while the
      RTP-in -> RTP-out round trip on the wire was 31.7 ms; adding 200 ms of
      delay in the answerer gave lag 1800. So a lag between the dumps is
      (wire delay - start offset) on the 20 ms packet grid. A peer that starts
      RTP late or leaves gaps shifts/compresses ``received``; measure such
      delays with a capture, not from the dumps.

    One call per instance. Usage::

        with BaresipCaller(tmp_path / "bs", utt.path) as bs:
            res = bs.run(bridge_port, timeout=30)
        peak, lag = normalized_xcorr(utt.samples, res.received)
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str],
        audio_wav: str | os.PathLike[str],
        *,
        user: str = "caller",
        codecs: str = "PCMU/8000/1",
        account_params: str = "",
        extra_config: Mapping[str, str] | None = None,
        sip_trace: bool = False,
        executable: str = "baresip",
    ) -> None:
        self.workdir = Path(workdir)
        self.audio_wav = Path(audio_wav).resolve()
        self.user = user
        self.codecs = codecs
        self.account_params = account_params
        self.extra_config = dict(extra_config or {})
        self.sip_trace = sip_trace
        self.executable = shutil.which(executable) or executable
        self.confdir = self.workdir / "conf"
        self.recdir = self.workdir / "rec"
        self.sip_port = 0
        self.proc: ManagedProcess | None = None
        self._t0 = 0.0

    # -- config ---------------------------------------------------------
    def _write_config(self, port: int) -> None:
        self.confdir.mkdir(parents=True, exist_ok=True)
        self.recdir.mkdir(parents=True, exist_ok=True)
        cfg: dict[str, str] = {
            "sip_listen": f"{LOOPBACK}:{port}",
            "net_interface": LOOPBACK,  # else SDP c= is the eth0 address
            "dns_server": f"{LOOPBACK}:53",
            "audio_player": "aubridge,nowhere",
            "audio_source": f"aufile,{self._source_wav()}",
            "audio_alert": "aubridge,nowhere",
            "rtp_ports": "20000-39999",
            "module_path": "/usr/lib/baresip/modules",
            "snd_path": str(self.recdir),
        }
        cfg.update(self.extra_config)
        lines = [f"{k}\t{v}" for k, v in cfg.items()]
        modules = ["stdio", "g711", "aufile", "aubridge", "sndfile"]
        if "G722" in self.codecs.upper():  # baresip's g722 module (spandsp's G.722)
            modules.insert(2, "g722")
        if "OPUS" in self.codecs.upper():  # baresip's opus module (libopus)
            modules.insert(2, "opus")
        lines += [f"module\t{m}.so" for m in modules]
        lines += [f"module_app\t{m}.so" for m in ("account", "contact", "menu")]
        (self.confdir / "config").write_text("\n".join(lines) + "\n")
        acct = f"<sip:{self.user}@{LOOPBACK}>;regint=0;audio_codecs={self.codecs}"
        if self.account_params:
            acct += ";" + self.account_params.lstrip(";")
        (self.confdir / "accounts").write_text(acct + "\n")
        (self.confdir / "contacts").write_text("")

    def _source_wav(self) -> Path:
        """The WAV aufile plays: `audio_wav`, or a copy at the codec's rate and channels, which aufile wants:
        16 kHz mono for G.722, 48 kHz stereo (both channels alike) for opus/48000/2."""
        wanted = 16000 if "G722" in self.codecs.upper() else 48000 if "OPUS" in self.codecs.upper() else 0
        if not wanted:
            return self.audio_wav
        import wave

        rate, samples = read_wav(self.audio_wav)
        wide = samples if rate == wanted else _resampled(samples, rate, wanted)
        channels = 2 if wanted == 48000 else 1
        path = self.workdir / f"source-{wanted}.wav"
        self.workdir.mkdir(parents=True, exist_ok=True)
        with wave.open(os.fspath(path), "wb") as w:
            w.setnchannels(channels)
            w.setsampwidth(2)
            w.setframerate(wanted)
            w.writeframes(np.repeat(wide.astype("<i2"), channels).tobytes())
        return path

    @staticmethod
    def target_uri(target: str | int) -> str:
        """``5090`` -> ``sip:bridge@127.0.0.1:5090``; a SIP URI is returned as is."""
        if isinstance(target, int) or str(target).isdigit():
            return f"sip:bridge@{LOOPBACK}:{int(target)}"
        return str(target)

    # -- lifecycle --------------------------------------------------------
    def start(
        self,
        target: str | int,
        *,
        quit_after_s: float | None = None,
        start_timeout: float = 10.0,
        attempts: int = 3,
    ) -> None:
        """Start baresip and dial ``target`` (a port or a SIP URI).

        ``quit_after_s`` passes ``-t N`` (baresip quits by itself after N s,
        integer). Retries with a new port if the SIP port was taken meanwhile.
        """
        if self.proc is not None:
            raise RuntimeError("already started")
        uri = self.target_uri(target)
        for attempt in range(attempts):
            port = free_udp_port(also_tcp=True, tcp_extra=(1,))
            self._write_config(port)
            argv = [self.executable, "-f", str(self.confdir), "-e", f"/dial {uri}"]
            if quit_after_s is not None:
                argv += ["-t", str(max(1, int(round(quit_after_s))))]
            if self.sip_trace:
                argv.append("-s")
            self._t0 = time.monotonic()
            proc = ManagedProcess(argv, cwd=self.workdir, stdin_pipe=True, name="baresip")
            failed = True
            try:
                m = proc.wait_for(r"connecting to|init failed", timeout=start_timeout)
                failed = "init failed" in m.group(0)
            except (TimeoutError, PeerError):
                pass
            finally:
                if failed:  # e.g. "ua: init failed (Address already in use)"
                    proc.stop(term_signals=2)
            if not failed:
                self.proc, self.sip_port = proc, port
                return
            if attempt + 1 == attempts:
                raise PeerError(f"baresip did not start; output:\n{_tail(proc.lines, 40)}")
        raise PeerError("baresip could not start")

    def hangup(self) -> None:
        """Ask baresip to hang up the current call (``/hangup`` on stdin)."""
        if self.proc is not None:
            self.proc.send("/hangup\n")

    def wait(self, timeout: float = 30.0) -> BaresipResult:
        """Wait (bounded) for the call to end, quit baresip, collect the result."""
        if self.proc is None:
            raise RuntimeError("not started")
        proc = self.proc
        timed_out = False
        try:
            proc.wait_for(_BS_ENDED, timeout=timeout)
        except TimeoutError:
            timed_out = True
        except PeerError:
            pass  # exited (e.g. -t elapsed) before the call ended
        finally:
            self.stop()
        return self._result(timed_out)

    def run(
        self, target: str | int, *, timeout: float = 30.0, quit_after_s: float | None = None
    ) -> BaresipResult:
        """:meth:`start` + :meth:`wait`; baresip is always stopped afterwards."""
        try:
            self.start(target, quit_after_s=quit_after_s)
            return self.wait(timeout)
        finally:
            self.stop()

    def stop(self) -> int | None:
        """Quit baresip: ``/quit``, then SIGTERM x2, then SIGKILL (by PID). Idempotent."""
        proc = self.proc
        if proc is None:
            return None
        try:
            if proc.running():
                proc.send("/quit\n")
                proc.wait(2.0)
        finally:
            rc = proc.stop(term_timeout=4.0, term_signals=2)
        return rc

    def _result(self, timed_out: bool) -> BaresipResult:
        assert self.proc is not None
        proc = self.proc
        out, err = proc.stdout, proc.stderr
        both = out + "\n" + err
        term = _BS_TERMINATED.search(both)
        closed_m = _BS_CLOSED.search(both)
        established = bool(_BS_ESTABLISHED.search(both))
        if closed_m:
            reason: str | None = closed_m.group(1).strip()
        elif term:
            reason = "terminated"
        else:
            reason = None
        end_line = next((ln for ln in proc.lines if _BS_ENDED.search(ln.text)), None)
        hangup_by = None
        if established and reason is not None:
            hangup_by = "remote" if closed_m else "caller"
        dec = sorted(self.recdir.glob("dump-*-dec.wav"))
        enc = sorted(self.recdir.glob("dump-*-enc.wav"))
        empty = np.zeros(0, dtype=np.int16)

        def load(paths: list[Path]) -> tuple[np.ndarray, Path | None]:
            if not paths:
                return empty, None
            try:
                rate, a = read_wav(paths[-1])
            except ValueError:
                return empty, paths[-1]
            a = a if a.ndim == 1 else a[:, 0]
            if rate != SAMPLE_RATE and rate % SAMPLE_RATE == 0:  # a wideband codec's dump: to 8 kHz
                a = _resampled(a, rate, SAMPLE_RATE)
            elif rate != SAMPLE_RATE:
                raise PeerError(f"{paths[-1]}: rate {rate}, expected {SAMPLE_RATE}")
            return a, paths[-1]

        received, rpath = load(dec)
        sent, spath = load(enc)
        return BaresipResult(
            returncode=proc.returncode,
            established=established,
            closed=reason is not None,
            close_reason=reason,
            hangup_by=hangup_by,
            end_of_file="audio error (0,end of file)" in both,
            timed_out=timed_out,
            received=received,
            sent=sent,
            received_path=rpath,
            sent_path=spath,
            stdout=out,
            stderr=err,
            duration_s=int(term.group(1)) if term else None,
            elapsed_s=(end_line.t if end_line else time.monotonic()) - self._t0,
            sip_port=self.sip_port,
            lines=proc.lines,
        )

    def __enter__(self) -> BaresipCaller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------
# SIPp
# --------------------------------------------------------------------------


@dataclass
class SippResult:
    """Outcome of :func:`run_sipp`.

    ``logs`` are the ``<log message=...>`` lines (``-trace_logs``);
    ``log_events`` maps the first word of each log line to the rest
    (e.g. ``{"ANSWERED": [call_id, ...], "BUSY": [...]}``). ``stats`` is the
    last row of the ``-trace_stat`` CSV (cumulative counters such as
    ``SuccessfulCall(C)``, ``FailedCall(C)``), ``errors`` the ``-trace_err``
    file. SIPp exit codes: 0 all calls succeeded, 1 some failed, 97 exit on
    internal command, 99 normal exit without calls processed, 255 fatal,
    254 could not bind; None if it had to be killed (``timed_out``).
    """

    returncode: int | None
    timed_out: bool
    logs: list[str]
    log_events: dict[str, list[str]]
    stats: dict[str, str]
    errors: str
    stdout: str
    stderr: str
    screen: str
    workdir: Path
    local_port: int
    media_port: int
    argv: list[str]

    def count(self, event: str) -> int:
        """How many log lines start with ``event`` (e.g. ``"ANSWERED"``)."""
        return len(self.log_events.get(event, []))

    def stat(self, name: str) -> int:
        """An integer counter from :attr:`stats`, e.g. ``stat("SuccessfulCall(C)")``."""
        return int(self.stats.get(name, "0") or 0)


def _parse_stat_csv(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    rows = [r for r in path.read_text(errors="replace").splitlines() if r.strip()]
    if len(rows) < 2:
        return {}
    head = rows[0].rstrip(";").split(";")
    last = rows[-1].rstrip(";").split(";")
    return dict(zip(head, last, strict=False))  # a truncated last row keeps what it has


def run_sipp(
    scenario: str | os.PathLike[str],
    target: str | int,
    *,
    calls: int = 1,
    rate: float = 10.0,
    rate_period_ms: int = 1000,
    limit: int | None = None,
    service: str = "bridge",
    extra_args: Sequence[str] = (),
    timeout: float = 60.0,
    workdir: str | os.PathLike[str],
    trace_msg: bool = False,
    executable: str = "sipp",
) -> SippResult:
    """Run SIPp in the foreground (no ``-bg``) against ``target`` and parse its outputs.

    ``scenario`` is a path or a name in :data:`SCENARIOS` (``"uac_busy"`` or
    ``"uac_busy.xml"``). ``target`` is a port on 127.0.0.1 or ``"host:port"``.
    Runs ``-m calls -l limit(=calls) -r rate -rp rate_period_ms`` with
    ``-i/-mi 127.0.0.1``, a free ``-p`` and ``-mp`` port, ``-nostdin``, and
    writes ``-trace_logs``/``-trace_err``/``-trace_stat``/``-trace_screen``
    (and ``-trace_msg`` if asked) into ``workdir``. SIPp gets ``-timeout`` a
    bit under ``timeout``, but SIPp 3.6.1 does not exit on it while a call is
    still retransmitting, so the process is also killed (by PID) at
    ``timeout``. Retries with new ports if SIPp could not bind (rc 254).
    Extra flags, e.g. ``["-set", "hold_ms", "1000"]``, go in ``extra_args``.
    """
    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    sc = Path(scenario)
    if not sc.exists():
        name = sc.name if sc.suffix == ".xml" else sc.name + ".xml"
        sc = SCENARIOS / name
    if not sc.exists():
        raise FileNotFoundError(scenario)
    remote = f"{LOOPBACK}:{int(target)}" if isinstance(target, int) or str(target).isdigit() else str(target)
    files = {
        k: wd / f"sipp_{k}" for k in ("logs.log", "errors.log", "stat.csv", "screen.log", "messages.log")
    }
    sipp_timeout = max(1, int(timeout - 3)) if timeout > 4 else max(1, int(timeout))
    deadline = time.monotonic() + timeout
    for attempt in range(3):
        for f in files.values():
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
        local_port = free_udp_port()
        media_port = _free_udp_port_pair()
        argv = [
            shutil.which(executable) or executable,
            "-sf",
            str(sc.resolve()),
            remote,
            "-s",
            service,
            "-i",
            LOOPBACK,
            "-mi",
            LOOPBACK,
            "-p",
            str(local_port),
            "-mp",
            str(media_port),
            "-m",
            str(calls),
            "-l",
            str(limit if limit is not None else calls),
            "-r",
            f"{rate:g}",
            "-rp",
            str(rate_period_ms),
            "-nostdin",
            "-timeout",
            f"{sipp_timeout}s",
            "-trace_logs",
            "-log_file",
            str(files["logs.log"]),
            "-trace_err",
            "-error_file",
            str(files["errors.log"]),
            "-trace_stat",
            "-stf",
            str(files["stat.csv"]),
            "-fd",
            "1",
            "-trace_screen",
            "-screen_file",
            str(files["screen.log"]),
        ]
        if trace_msg:
            argv += ["-trace_msg", "-message_file", str(files["messages.log"])]
        argv += list(extra_args)
        proc = ManagedProcess(argv, cwd=wd, name="sipp")
        timed_out = False
        try:
            if proc.wait(deadline - time.monotonic()) is None:
                timed_out = True
        finally:
            proc.stop(term_timeout=3.0)
        # 254 (= -2): could not bind a socket -> a port was grabbed meanwhile.
        if timed_out or proc.returncode != 254 or attempt == 2:
            break
    returncode = None if timed_out else proc.returncode

    def read(p: Path) -> str:
        return p.read_text(errors="replace") if p.exists() else ""

    logs = [ln.strip() for ln in read(files["logs.log"]).splitlines() if ln.strip()]
    events: dict[str, list[str]] = {}
    for ln in logs:
        head, _, rest = ln.partition(" ")
        events.setdefault(head, []).append(rest)
    return SippResult(
        returncode=returncode,
        timed_out=timed_out,
        logs=logs,
        log_events=events,
        stats=_parse_stat_csv(files["stat.csv"]),
        errors=read(files["errors.log"]),
        stdout=proc.stdout,
        stderr=proc.stderr,
        screen=read(files["screen.log"]),
        workdir=wd,
        local_port=local_port,
        media_port=media_port,
        argv=argv,
    )


# --------------------------------------------------------------------------
# baresip's command interface (stdin) during a call; pjsua2 as a caller
# --------------------------------------------------------------------------

# baresip 1.0.0 reads its stdin as key presses (module stdio, menu): a digit, '*', '#' or A-D while a call is
# established is sent as a DTMF digit (RFC 4733, "audio: send DTMF digit: 'N'"); a line starting with '/' is a
# command: '/hold' (re-INVITE sendonly, "call: hold <uri>"), '/resume' (re-INVITE sendrecv, "call: resume
# <uri>"), '/hangup', '/quit'. Each helper waits (bounded) for baresip's own line saying it acted.


def baresip_established(caller: BaresipCaller, timeout: float = 10.0) -> None:
    """Wait until baresip's call is established."""
    if caller.proc is None:
        raise RuntimeError("baresip not started")
    caller.proc.wait_for(_BS_ESTABLISHED, timeout)


def baresip_dtmf(caller: BaresipCaller, digits: str, timeout: float = 10.0) -> None:
    """Press `digits` in baresip's call (RFC 4733 events); returns when the last digit's end was sent."""
    if caller.proc is None:
        raise RuntimeError("baresip not started")
    if not digits or any(d not in "0123456789*#ABCD" for d in digits):
        raise ValueError(f"not DTMF digits: {digits!r}")
    mark = caller.proc.line_count()
    caller.proc.send(digits)
    caller.proc.wait_for(rf"send DTMF digit end: '{re.escape(digits[-1])}'", timeout, since=mark)


def baresip_hold(caller: BaresipCaller, timeout: float = 10.0) -> None:
    """Put baresip's call on hold (re-INVITE with a=sendonly)."""
    if caller.proc is None:
        raise RuntimeError("baresip not started")
    mark = caller.proc.line_count()
    caller.proc.send("/hold\n")
    caller.proc.wait_for(r"call: hold ", timeout, since=mark)


def baresip_resume(caller: BaresipCaller, timeout: float = 10.0) -> None:
    """Take baresip's call off hold (re-INVITE with a=sendrecv)."""
    if caller.proc is None:
        raise RuntimeError("baresip not started")
    mark = caller.proc.line_count()
    caller.proc.send("/resume\n")
    caller.proc.wait_for(r"call: resume ", timeout, since=mark)


def sip_trace_responses(text: str, method: str) -> list[int]:
    """Status codes of the responses to `method` in a SIP trace (baresip `-s`, SIPp `-trace_msg`), in order.

    A response is a ``SIP/2.0 NNN`` start line; the first ``CSeq: N METHOD`` line after it, before the next
    start line, names its method (the harness drops blank lines, so messages are told apart by start lines).
    A retransmission (the same status for the same CSeq number again, e.g. a 200 resent before the ACK came)
    counts once."""
    start = re.compile(r"^(?:SIP/2\.0 (\d{3}) |[A-Z]+ \S+ SIP/2\.0\s*$)")
    cseq = re.compile(r"^(?:CSeq|cseq):\s*(\d+)\s+(\S+)", re.IGNORECASE)
    codes: list[int] = []
    seen: set[tuple[str, int]] = set()
    status: int | None = None
    for line in text.splitlines():
        line = line.strip()
        m = start.match(line)
        if m:
            status = int(m.group(1)) if m.group(1) else None
            continue
        c = cseq.match(line)
        if c and status is not None:
            if c.group(2).upper() == method.upper() and (c.group(1), status) not in seen:
                seen.add((c.group(1), status))
                codes.append(status)
            status = None
    return codes


PJSUA2_CALLER = Path(__file__).resolve().parent / "pjsua2_caller.py"


@dataclass
class Pjsua2CallResult:
    """Outcome of :func:`run_pjsua2_caller`: its JSON summary (see pjsua2_caller.py), the recording, the
    output. ``offset_samples`` is where the recording starts on the timeline of the file it played
    (received_t0 - sent_t0, in samples), so ``recording[n]`` is heard at file sample ``n + offset``."""

    returncode: int | None
    summary: dict[str, object]
    received: np.ndarray
    offset_samples: int
    stdout: str
    stderr: str


def run_pjsua2_caller(
    target: str | int,
    workdir: str | os.PathLike[str],
    *,
    play: str | os.PathLike[str] | None = None,
    args: Sequence[str] = (),
    timeout: float = 30.0,
    python: str | None = None,
) -> Pjsua2CallResult:
    """Run tests/integration/pjsua2_caller.py (one call, its own process) and parse its summary.

    ``target`` is a port on 127.0.0.1 or a SIP URI; ``args`` go to the script (``--duration``, ``--dtmf``,
    ``--hold-at``, ``--wait-bye``, ...). The process is bounded by ``timeout`` (the script's own
    ``--timeout`` is a bit shorter) and always stopped by PID."""
    import json

    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    uri = BaresipCaller.target_uri(target)
    record = wd / "pjsua2-heard.wav"
    argv: list[str] = [
        python or sys.executable,
        str(PJSUA2_CALLER),
        uri,
        "--record",
        str(record),
        "--timeout",
        f"{max(1.0, timeout - 5):g}",
    ]
    if play is not None:
        argv += ["--play", os.fspath(play)]
    argv += list(args)
    proc = ManagedProcess(argv, cwd=wd, name="pjsua2-caller")
    try:
        rc = proc.wait(timeout)
    finally:
        proc.stop(term_timeout=3.0)
    proc._out.join(2.0)
    summary: dict[str, object] = {}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                summary = json.loads(line)
                break
    received = np.zeros(0, dtype=np.int16)
    if record.exists():
        with contextlib.suppress(ValueError):
            received = read_wav(record)[1]
    t_sent, t_recv = summary.get("sent_t0_ns"), summary.get("received_t0_ns")
    offset = (
        round((int(t_recv) - int(t_sent)) * SAMPLE_RATE / 1e9)
        if isinstance(t_sent, int) and isinstance(t_recv, int)
        else 0
    )
    return Pjsua2CallResult(
        returncode=rc,
        summary=summary,
        received=received,
        offset_samples=offset,
        stdout=proc.stdout,
        stderr=proc.stderr,
    )


def can_bind(host: str) -> bool:
    """A UDP socket can be bound to `host` here (127.0.0.2, ::1: not every machine has them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((host, 0))
        return True
    except OSError:
        return False


def second_loopback_usable() -> bool:
    """127.0.0.2 can be bound (a second source on loopback: policy and flood tests)."""
    return can_bind("127.0.0.2")
