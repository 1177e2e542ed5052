"""The media path's compiled twins, chosen here at import: the one place that says which path runs.

`rtp/_speedups.c` is a small C extension (CPython C API, no other dependency) built by `pip install -e .`
where a compiler exists (setup.py: the build is optional, a failed compile leaves the package installed
without it). Each of its functions answers exactly as its pure-Python twin, for every input (the parity
property test, tests/unit/rtp/test_speedups_parity.py); an input outside the common case is handed to the
pure twin by the C code itself, so errors and odd types come out as the pure path gives them.

- `parse`, `pack_into`: rtp.packet's (the RTP header read and write, per packet either way);
- `table_decode(table, pure)`: rtp.jitter `table_decoder`'s G.711 frame decoder (per caller frame);
- `recv_stamped(sock, size)`: the read of rtp.endpoint `read_rtp` on an IPv4 socket (a datagram, its source,
  the kernel's receive time, None for an empty socket): None on the pure path, where `read_rtp` reads with
  `socket.recvmsg` itself (this module imports no socket: a sans-I/O module, DESIGN §3.1);
- `send_batch(socks, datagrams, addresses, results)`: rtp.endpoint `SendBatch`'s sends, a media-clock tick's RTP
  datagrams in one call: `sock.sendto(datagrams[i], addresses[i])` for each i in order, `results[i]` 0 when it
  returned, 1 when it raised OSError (refused: buffer full, unreachable, closed); returns how many were refused.
  Any other exception is raised at its entry (the entries after it are left unsent). The compiled twin sends a
  numeric IPv4 destination with sendto(2) itself and hands any other to `socket.sendto`.

`COMPILED` says which path runs (`parlora-bridge doctor` and `GET /sip` report it as `media_path`). The
environment variable PARLORA_PURE_MEDIA=1 forces the pure path (tests, a suspected difference in the field);
`pure` and `compiled` hold both sets whatever was chosen (`compiled` is None when the extension is not built),
so that the parity test can compare them in one process.

Measured (tests/bench/README.md, "Compiled media path"): what each saves per packet and per call slot. A C
function is wired here only if it was measurably faster and parity holds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any

from rtp import packet as _packet

__all__ = [
    "COMPILED",
    "MEDIA_PATH",
    "Impl",
    "compiled",
    "pack_into",
    "parse",
    "pure",
    "recv_stamped",
    "send_batch",
    "table_decode",
]

PURE_ENV = "PARLORA_PURE_MEDIA"


RecvStamped = Callable[[Any, int], "tuple[bytes, tuple[str, int], int] | None"]
SendBatch = Callable[[list[Any], list[Any], list[Any], bytearray], int]


@dataclass(frozen=True, slots=True)
class Impl:
    """One implementation of the replaced functions (see the module docstring)."""

    name: str  # "compiled" or "pure"
    parse: Callable[[bytes], _packet.RtpPacket | _packet.Drop]
    pack_into: Callable[[bytearray, int, bool, int, int, int, bytes | bytearray], int]
    table_decode: Callable[[bytes, Callable[[bytes], bytes]], Callable[[bytes], bytes]]
    recv_stamped: RecvStamped | None
    send_batch: SendBatch


def _pure_table_decode(table: bytes, pure: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
    return pure


def _send_batch(socks: list[Any], datagrams: list[Any], addresses: list[Any], results: bytearray) -> int:
    refused = 0
    for i, sock in enumerate(socks):
        try:
            sock.sendto(datagrams[i], addresses[i])
        except OSError:
            results[i] = 1
            refused += 1
        else:
            results[i] = 0
    return refused


def _load() -> ModuleType | None:
    try:
        from rtp import _speedups  # type: ignore[attr-defined]  # built by setup.py where a compiler exists
    except ImportError:
        return None
    _speedups.setup(_packet.RtpPacket, tuple(_packet.Drop), _packet.parse, _packet.pack_into)
    return _speedups  # type: ignore[no-any-return]


def _compiled(module: ModuleType) -> Impl:
    decode = module.g711_decode

    def table_decode(table: bytes, pure: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
        return partial(decode, table, pure)

    return Impl(
        "compiled", module.parse, module.pack_into, table_decode, module.recv_stamped, module.send_batch
    )


pure = Impl("pure", _packet.parse, _packet.pack_into, _pure_table_decode, None, _send_batch)
_module = _load()
compiled: Impl | None = _compiled(_module) if _module is not None else None
_active = pure if compiled is None or os.environ.get(PURE_ENV, "") not in ("", "0") else compiled

COMPILED = _active is compiled
MEDIA_PATH = _active.name  # "compiled" or "pure": what doctor and GET /sip report
parse = _active.parse
pack_into = _active.pack_into
table_decode = _active.table_decode
recv_stamped = _active.recv_stamped
send_batch = _active.send_batch
