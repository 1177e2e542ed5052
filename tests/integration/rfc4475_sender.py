"""RFC 4475 torture messages at a live `parlora-bridge serve`, over UDP, inside a private network namespace.

Run by tests/integration/test_rfc4475_live.py as

    unshare --net sh -c 'ip link set lo up && exec python rfc4475_sender.py --engine native --corpus DIR ...'

It refuses to run unless the only network interface it can see is the loopback one: the messages name 192.0.2.x
and example.com hosts, and nothing a server answers may leave the machine. Inside the namespace it starts
`serve --engine NAME` on 127.0.0.1:5070 and, in order:

1. sends every `valid/*.dat` and `invalid/*.dat` file (read by path, byte for byte) from 127.0.0.1:5060 — the
   port RFC 3261 §18.2.2 sends a response to when the top Via names no port and no rport — and records every
   response the bridge sends in the next moments, whatever its destination: a raw AF_PACKET socket on `lo`
   sees each datagram the bridge sends (its source port is 5070), so a response to a Via port nobody listens
   on is still seen. A response is attributed to a message by its Call-ID. The wait per message ends at the
   first final response (plus 50 ms), or after `--wait` seconds;
2. sends `--fuzz N` hypothesis-mutated corpus messages (byte flips, truncations, inserted bytes, duplicated or
   dropped lines), without waiting for answers;
3. checks the bridge process is alive, and places a normal SIPp call (uac_busy: INVITE, 200, ACK, BYE).

It prints one JSON object on stdout: {"engine", "messages": [{"set", "name", "method", "responses": [codes],
"final": code|null}], "alive_after_corpus", "fuzz": {"sent", "alive_after"}, "sipp": {"rc", "answered",
"closed"}, "bridge_log_tail"}; the test judges it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import select
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import peers  # noqa: E402

BRIDGE_PORT = 5070
SENDER_PORT = 5060
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
CALL_ID = re.compile(rb"^(?:call-id|i)[ \t]*:[ \t]*([^\r\n]*)", re.IGNORECASE | re.MULTILINE)
STATUS = re.compile(rb"^SIP/2\.0 (\d{3}) ")


def only_loopback() -> bool:
    return sorted(name for _, name in socket.if_nameindex()) == ["lo"]


def call_id(message: bytes) -> bytes | None:
    head = message.split(b"\r\n\r\n", 1)[0].replace(b"\r\n ", b" ").replace(b"\r\n\t", b" ")
    m = CALL_ID.search(head)
    return m.group(1).strip() if m else None


class Sniffer:
    """Every UDP datagram leaving 127.0.0.1:`port` on lo (AF_PACKET, outgoing copies only)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.bind(("lo", 0))
        self.sock.setblocking(False)

    def read(self, timeout: float) -> list[bytes]:
        out: list[bytes] = []
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        while ready:
            try:
                frame, addr = self.sock.recvfrom(70000)
            except BlockingIOError:
                break
            if addr[2] == PACKET_OUTGOING:
                payload = self._udp_from(frame)
                if payload is not None:
                    out.append(payload)
            ready, _, _ = select.select([self.sock], [], [], 0)
        return out

    def _udp_from(self, frame: bytes) -> bytes | None:
        ip = frame[14:]  # lo's link header is a zero Ethernet header
        if len(ip) < 28 or ip[0] >> 4 != 4 or ip[9] != socket.IPPROTO_UDP:
            return None
        ihl = (ip[0] & 0x0F) * 4
        sport, _dport, length = struct.unpack_from("!HHH", ip, ihl)
        if sport != self.port:
            return None
        return bytes(ip[ihl + 8 : ihl + length])


VIA = re.compile(rb"^(?:via|v)[ \t]*:[ \t]*([^\r\n]*)", re.IGNORECASE | re.MULTILINE)


def transaction_key(message: bytes) -> tuple[bytes, bytes, bytes] | None:
    """(method, top Via sent-by, branch), roughly as RFC 3261 §17.2.3 matches a request to a server
    transaction; None if it cannot be read. Many RFC 4475 messages share a branch (`z9hG4bKkdjuw`) and a
    sent-by: sent to one server one after the other, a later one is (rightly) taken for a retransmission of an
    earlier one of the same method."""
    head = message.split(b"\r\n\r\n", 1)[0].replace(b"\r\n ", b" ").replace(b"\r\n\t", b" ")
    via = VIA.search(head)
    if via is None:
        return None
    value = via.group(1).split(b",", 1)[0]
    parts = re.split(rb"\s*;\s*", value)
    sent_by = re.sub(rb"\s+", b"", parts[0]).rsplit(b"/", 1)[-1].lower()
    branch = next((p.split(b"=", 1)[1].strip() for p in parts[1:] if p.lower().startswith(b"branch")), b"")
    method = head.split(b" ", 1)[0]
    return method, sent_by, branch


def batches(paths: list[Path]) -> list[list[Path]]:
    """The messages in the fewest batches (in order) where no two share a transaction key: each batch goes to
    a bridge started afresh, so every message is judged on its own."""
    out: list[tuple[list[Path], set[tuple[bytes, bytes, bytes]]]] = []
    for path in paths:
        key = transaction_key(path.read_bytes())
        for batch, keys in out:
            if key is None or key not in keys:
                batch.append(path)
                if key is not None:
                    keys.add(key)
                break
        else:
            out.append(([path], {key} if key is not None else set()))
    return [batch for batch, _ in out]


def send_one(
    path: Path, subset: str, sniffer: Sniffer, sender: socket.socket, wait_s: float
) -> dict[str, object]:
    message = path.read_bytes()
    cid = call_id(message)
    first_line = message.split(b"\r\n", 1)[0].split(b"\n", 1)[0]
    method = first_line.split(b" ", 1)[0].decode("latin-1")
    sniffer.read(0)  # drop what is left from earlier messages (200 retransmissions, ...)
    sender.sendto(message, ("127.0.0.1", BRIDGE_PORT))
    codes: list[int] = []
    other: list[str] = []  # responses in the window with another Call-ID: earlier messages' retransmissions
    deadline = time.monotonic() + wait_s
    final_at: float | None = None
    while True:
        now = time.monotonic()
        end = min(deadline, final_at + 0.05) if final_at is not None else deadline
        if now >= end:
            break
        for packet in sniffer.read(end - now):
            status = STATUS.match(packet)
            if status is None:
                continue  # a request from the bridge (a BYE after Timer H, ...)
            if cid is not None and call_id(packet) != cid:
                other.append(f"{status.group(1).decode()} {(call_id(packet) or b'?').decode('latin-1')[:40]}")
                continue
            code = int(status.group(1))
            codes.append(code)
            if code >= 200 and final_at is None:
                final_at = time.monotonic()
    finals = [c for c in codes if c >= 200]
    return {
        "set": subset,
        "name": path.stem,
        "method": method,
        "responses": codes,
        "final": finals[0] if finals else None,
        "other": other,
    }


def mutate(rng: random.Random, seed: bytes, ops: int) -> bytes:
    data = bytearray(seed)
    for _ in range(ops):
        kind = rng.randrange(6)
        if not data:
            data = bytearray(b"\r\n")
        i = rng.randrange(len(data))
        if kind == 0:
            data[i] = rng.randrange(256)
        elif kind == 1:
            del data[i : i + rng.randrange(1, 16)]
        elif kind == 2:
            data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
        elif kind == 3:
            data[i:i] = rng.choice([b"\r\n", b" ", b"\t", b":", b";", b",", b"<", b">", b'"', b"%", b"\x00"])
        else:
            lines = bytes(data).split(b"\r\n")
            j = rng.randrange(len(lines))
            if kind == 4:
                lines.insert(j, lines[j])  # a repeated header line
            else:
                del lines[j]
            data = bytearray(b"\r\n".join(lines))
    return bytes(data[:65000])


def normal_call(port: int, workdir: Path) -> tuple[dict[str, int], peers.SippResult]:
    """One ordinary SIPp call (answered, held 0.5 s, BYE) after the hostile input: its rc, answered, closed."""
    sipp = peers.run_sipp("uac_busy", port, calls=1, workdir=workdir, timeout=30,
                          extra_args=["-set", "hold_ms", "500"])  # fmt: skip
    return {"rc": sipp.returncode, "answered": sipp.count("ANSWERED"), "closed": sipp.count("CLOSED")}, sipp


def fuzz(corpus: Path, sender: socket.socket, count: int, seed: int) -> int:
    """`count` mutated corpus messages, generated by hypothesis (bounded, derandomised), sent back to back."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    seeds = [p.read_bytes() for p in sorted(corpus.glob("*/*.dat"))]
    sent = [0]

    @settings(
        max_examples=count,
        database=None,
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.sampled_from(seeds), st.integers(0, 2**32 - 1), st.integers(1, 6))
    def one(message: bytes, rng_seed: int, ops: int) -> None:
        sender.sendto(mutate(random.Random(rng_seed ^ seed), message, ops), ("127.0.0.1", BRIDGE_PORT))
        sent[0] += 1
        if sent[0] % 25 == 0:
            time.sleep(0.02)  # a burst of 25, then a breath: a flood is not the point here

    one()
    return sent[0]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", default="native")
    parser.add_argument("--corpus", type=Path, required=True, help="the directory with valid/ and invalid/")
    parser.add_argument("--wait", type=float, default=1.5, help="seconds to wait for a response per message")
    parser.add_argument("--fuzz", type=int, default=300, help="hypothesis-mutated messages to send")
    parser.add_argument("--seed", type=int, default=4475)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--log-level", default="info", help="the bridge's --log-level")
    args = parser.parse_args()
    if not only_loopback():
        print(
            json.dumps({"error": f"not in a private network namespace: interfaces {socket.if_nameindex()}"})
        )
        return 2
    work = args.workdir or Path(tempfile.mkdtemp(prefix="rfc4475-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")} | {"PYTHONUNBUFFERED": "1"}
    argv = [
        sys.executable,
        "-m",
        "bridge",
        "serve",
        "--engine",
        args.engine,
        "--sip",
        f"127.0.0.1:{BRIDGE_PORT}",
    ]
    argv += ["--rtp-port", "30000", "--provider", "echo", "--log-level", args.log_level]
    argv += ["--drain-timeout", "0"]  # SIGTERM ends it at once: calls to 192.0.2.x never finish by themselves
    out: dict[str, object] = {"engine": args.engine}
    messages: list[dict[str, object]] = []
    logs: list[str] = []
    rcs: list[int | None] = []
    sniffer = Sniffer(BRIDGE_PORT)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.bind(("127.0.0.1", SENDER_PORT))
    subset_of = {p: p.parent.name for p in args.corpus.glob("*/*.dat")}
    ordered = sorted((args.corpus / "valid").glob("*.dat")) + sorted((args.corpus / "invalid").glob("*.dat"))
    plan = batches(ordered)
    out["batches"] = [[p.stem for p in batch] for batch in plan]
    bridge: peers.ManagedProcess | None = None
    try:
        alive = True
        for batch in plan:  # a fresh bridge per batch: no message is taken for another's retransmission
            bridge = peers.ManagedProcess(argv, cwd=ROOT, env=env, name="parlora-bridge")
            bridge.wait_for(rf"listening on udp 127\.0\.0\.1:{BRIDGE_PORT}", timeout=30)
            for path in batch:
                messages.append(send_one(path, subset_of[path], sniffer, sender, args.wait))
            alive = alive and bridge.running()
            if batch is not plan[-1]:
                rcs.append(bridge.stop(term_timeout=15.0))
                logs.append(bridge.stderr)
                bridge = None
        out["messages"] = messages
        out["alive_after_corpus"] = alive
        assert bridge is not None
        sent = fuzz(args.corpus, sender, args.fuzz, args.seed) if args.fuzz else 0
        time.sleep(1.0)  # let the last datagrams be processed before judging (pacing, not an assertion)
        out["fuzz"] = {"sent": sent, "alive_after": bridge.running()}
        summary, sipp = normal_call(BRIDGE_PORT, work / "sipp")
        out["sipp"] = summary | {"logs": sipp.logs[-5:], "errors": sipp.errors[-1500:]}
        out["alive_at_end"] = bridge.running()
    except Exception as exc:  # reported in the JSON; the test fails on it
        out["error"] = repr(exc)
        out["messages"] = messages
    finally:
        if bridge is not None:
            rcs.append(bridge.stop(term_timeout=15.0))
            logs.append(bridge.stderr)
        for n, log in enumerate(logs):
            (work / f"bridge-{n}.log").write_text(log)
        out["bridge_rcs"] = rcs
        out["bridge_log_tail"] = logs[-1][-4000:] if logs else ""
        out["bridge_tracebacks"] = sum(log.count("Traceback") for log in logs)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
