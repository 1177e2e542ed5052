"""SIP on the wire, before parsing (RFC 3261 §18.3, RFC 5626 §3.5.1): where one message ends on a stream, and
which datagram is no message at all. No I/O, no clock.

- `StreamFramer` for TCP/TLS (§18.3): bytes in, messages (or `ParseError`s) out, framed by Content-Length, with
  the double-CRLF keep-alive pings counted for the shell to answer.
- `is_keepalive(datagram)` tells a CRLF keep-alive on UDP from a message.
"""

from __future__ import annotations

from sip.core.headers import bounded_int
from sip.core.message import MAX_MESSAGE_SIZE, Message, ParseError, Request, parse

__all__ = ["StreamFramer", "is_keepalive"]


def is_keepalive(data: bytes) -> bool:
    """True for a datagram of nothing but CR and LF (a NAT keep-alive such as RFC 5626's CRLF): not a message,
    and not an error to count."""
    return bool(data) and not data.strip(b"\r\n")


class StreamFramer:
    """Frames SIP messages on a byte stream (TCP, TLS; RFC 3261 §18.3) by Content-Length, which is mandatory.

    `feed(data)` returns the messages (or `ParseError`s) completed by these bytes. CRLFs between messages are
    skipped; each double CRLF among them is a keep-alive ping (RFC 5626 §3.5.1) that the shell should answer
    with a single CRLF: `take_pings()` returns how many arrived since the last call. A header section longer
    than `max_size` (513), or a missing or unusable Content-Length (400), cannot be framed: the error is
    returned, `must_close` becomes True and every later byte is ignored; close the connection. An error in a
    message that *was* framed (say a bad CSeq) leaves the stream usable.
    """

    __slots__ = ("_buffer", "_max_size", "_closed", "_pings", "_crlfs", "_need", "_scanned")

    def __init__(self, *, max_size: int = MAX_MESSAGE_SIZE) -> None:
        self._buffer = bytearray()
        self._max_size = max_size
        self._closed = False
        self._pings = 0
        self._crlfs = 0  # CR LF pairs seen in a row between messages
        self._need = 0  # length of the message being received, once its header section is complete
        self._scanned = 0  # how far the search for the end of the header section got

    @property
    def must_close(self) -> bool:
        """True once the stream cannot be framed any more (the caller should close the connection)."""
        return self._closed

    @property
    def buffered(self) -> int:
        """Bytes held waiting for the rest of a message."""
        return len(self._buffer)

    def take_pings(self) -> int:
        """How many double-CRLF keep-alives arrived since the last call."""
        pings, self._pings = self._pings, 0
        return pings

    def feed(self, data: bytes) -> list[Message | ParseError]:
        """Add bytes from the stream; return what they completed, in order."""
        if self._closed:
            return []
        buffer = self._buffer
        buffer += data
        out: list[Message | ParseError] = []
        while buffer:
            if not self._need:
                if not self._skip_crlfs():  # nothing left, or a lone CR waiting for its LF
                    break
                end = buffer.find(b"\r\n\r\n", max(0, self._scanned - 3))
                if end < 0:
                    self._scanned = len(buffer)
                    if len(buffer) > self._max_size:
                        out.append(self._fail(513, "Message Too Large"))
                    break
                self._scanned = self._crlfs = 0
                length = _stream_content_length(bytes(buffer[:end]))
                if isinstance(length, ParseError):
                    out.append(self._fail(length.status, length.reason))
                    break
                self._need = end + 4 + length
                if self._need > self._max_size:
                    out.append(self._fail(513, "Message Too Large"))
                    break
            if len(buffer) < self._need:
                break
            frame = bytes(buffer[: self._need])
            del buffer[: self._need]
            self._need = 0
            try:
                out.append(parse(frame, max_size=self._max_size))
            except ParseError as error:
                out.append(error)
        return out

    def _skip_crlfs(self) -> bool:
        """Drop the CRLFs before a message, counting double-CRLF pings; True if a message seems to start."""
        buffer = self._buffer
        while buffer[:2] == b"\r\n":
            del buffer[:2]
            self._crlfs += 1
            if self._crlfs == 2:
                self._pings += 1
                self._crlfs = 0
        return bool(buffer) and buffer != b"\r"

    def _fail(self, status: int, reason: str, partial: Request | None = None) -> ParseError:
        self._closed = True
        self._buffer.clear()
        return ParseError(status, reason, partial)


def _stream_content_length(head: bytes) -> int | ParseError:
    """Content-Length from a header section, or the error that makes the stream unframeable. The scan is
    loose on purpose: a message with some other bad header is still framed, so that `parse` can answer it."""
    values: list[str] = []
    for line in head.decode("utf-8", "replace").replace("\r\n ", " ").replace("\r\n\t", " ").split("\r\n"):
        name, colon, value = line.partition(":")
        if colon and name.strip().lower() in ("content-length", "l"):
            values.append(value.strip())
    if not values:
        return ParseError(400, "Missing Content-Length header (mandatory on streams)")
    length = bounded_int(values[0], 10) if len(values) == 1 else None
    if length is None:
        return ParseError(400, "Bad Content-Length header")
    return length
