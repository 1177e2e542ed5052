"""Property tests of the SIP message parser, the stream framer, the URI parser, the header helpers and SDP:
arbitrary bytes and mutations of the RFC 4475 messages never raise anything but ParseError / ValueError, and
whatever parses serialises to something that parses back to the same value.

CI runs 200 examples per property; `PARLORA_FUZZ_EXAMPLES=100000` runs a longer campaign (from tests/bench)."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sip.core.framing import StreamFramer
from sip.core.headers import Headers, parse_cseq, parse_name_addr, parse_via
from sip.core.message import ParseError, Request, Response, make_response, parse, serialize
from sip.core.offer_answer import LocalMedia, answer, offer
from sip.core.sdp import SdpError, hold_state, parse_sdp, serialize_sdp
from sip.core.uri import SipUri, parse_uri

EXAMPLES = int(os.environ.get("PARLORA_FUZZ_EXAMPLES", "200"))
fuzz = settings(max_examples=EXAMPLES, deadline=None)

CORPUS_DIR = Path(os.environ.get("PARLORA_RFC4475_DIR", "/work/shared/corpus/rfc4475"))
CORPUS = [path.read_bytes() for path in sorted(CORPUS_DIR.glob("*/*.dat"))] or [
    b"OPTIONS sip:a@example.com SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\nFrom: <sip:b@example.com>;tag=1\r\n"
    b"To: <sip:a@example.com>\r\nCall-ID: c\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
]
SDP_BODIES = [body for body in (data.partition(b"\r\n\r\n")[2] for data in CORPUS) if body.startswith(b"v=0")]
LOCAL = LocalMedia("192.0.2.10", 40000, 1)

PIECES = [
    b"\r\n",
    b" ",
    b"\t",
    b":",
    b";",
    b",",
    b"<",
    b">",
    b'"',
    b"\\",
    b"%",
    b"=",
    b"@",
    b"/",
    b"\r\n ",
    b"\x00",
]


@st.composite
def mutated(draw: st.DrawFn, corpus: list[bytes]) -> bytes:
    """A corpus message with a few bytes or lines changed, removed, repeated or cut."""
    data = bytearray(draw(st.sampled_from(corpus)))
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.integers(0, 6))
        position = draw(st.integers(0, len(data))) if data else 0
        if kind == 0 and data:  # overwrite a byte
            data[min(position, len(data) - 1)] = draw(st.integers(0, 255))
        elif kind == 1:  # insert a SIP-significant piece
            data[position:position] = draw(st.sampled_from(PIECES))
        elif kind == 2:  # delete a range
            data[position : position + draw(st.integers(1, 20))] = b""
        elif kind == 3:  # repeat a line
            lines = bytes(data).split(b"\r\n")
            index = draw(st.integers(0, len(lines) - 1))
            lines.insert(index, lines[index])
            data = bytearray(b"\r\n".join(lines))
        elif kind == 4:  # drop a line
            lines = bytes(data).split(b"\r\n")
            del lines[draw(st.integers(0, len(lines) - 1))]
            data = bytearray(b"\r\n".join(lines))
        elif kind == 5:  # insert random bytes
            data[position:position] = draw(st.binary(max_size=12))
        else:  # change the case of a stretch
            stretch = bytes(data[position : position + 8])
            data[position : position + 8] = stretch.swapcase()
    return bytes(data)


messages_bytes = st.one_of(st.binary(max_size=600), mutated(CORPUS), st.sampled_from(CORPUS))


def _round_trips(message: Request | Response) -> None:
    again = parse(serialize(message))
    assert again == message
    assert serialize(again) == serialize(message)


@fuzz
@given(messages_bytes)
def test_parse_raises_only_parse_error_and_round_trips(data: bytes) -> None:
    try:
        message = parse(data)
    except ParseError as error:
        assert 400 <= error.status <= 599 and error.reason
        if error.partial is not None:
            response = make_response(error.partial, error.status, error.reason, to_tag="x")
            assert serialize(response).startswith(f"SIP/2.0 {error.status} {error.reason}\r\n".encode())
        return
    _round_trips(message)
    if isinstance(message, Request):
        response = make_response(message, 200, to_tag="t")
        assert parse(serialize(response)) == response


@fuzz
@given(messages_bytes, st.lists(st.integers(1, 64), min_size=1, max_size=40))
def test_stream_framer_raises_nothing(data: bytes, cuts: list[int]) -> None:
    framer = StreamFramer(max_size=4096)
    position = 0
    for size in cuts:
        for item in framer.feed(data[position : position + size]):
            assert isinstance(item, (Request, Response, ParseError))
        position += size
    framer.feed(data[position:])
    assert framer.buffered <= 4096 + 64 or framer.must_close


def _parsed_corpus() -> list[Request | Response]:
    out: list[Request | Response] = []
    for data in CORPUS:
        try:
            out.append(parse(data))
        except ParseError:
            continue
    return out


PARSED = _parsed_corpus()


@fuzz
@given(
    st.lists(st.sampled_from(PARSED), min_size=1, max_size=5),
    st.lists(st.sampled_from([b"", b"\r\n", b"\r\n\r\n"]), min_size=5, max_size=5),
    st.lists(st.integers(1, 200), min_size=1, max_size=30),
)
def test_stream_framer_frames_what_serialize_wrote(
    messages: list[Request | Response], gaps: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(gap + serialize(message) for gap, message in zip(gaps, messages, strict=False))
    framer = StreamFramer()
    out: list[object] = []
    position = 0
    for size in cuts:
        out.extend(framer.feed(stream[position : position + size]))
        position += size
    out.extend(framer.feed(stream[position:]))
    assert out == messages and not framer.must_close and framer.buffered == 0


# --- generated messages -----------------------------------------------------------------------------------------

token = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.!%*_+`'~",
    min_size=1,
    max_size=12,
)
host = st.one_of(
    st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9](\.[a-z][a-z0-9]{0,6}){0,3}", fullmatch=True),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(str),
)
uri_text = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=10)
sip_uris = st.builds(
    SipUri,
    st.sampled_from(["sip", "sips"]),
    st.one_of(st.none(), uri_text.filter(bool)),
    st.none(),
    host,
    st.one_of(st.none(), st.integers(0, 65535)),
    st.lists(st.tuples(token, st.one_of(st.none(), uri_text.filter(bool))), max_size=3).map(tuple),
    st.lists(st.tuples(token, uri_text), max_size=2).map(tuple),
)
header_value = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cc", "Cs", "Zl", "Zp")), max_size=30
).map(str.strip)


@st.composite
def requests(draw: st.DrawFn) -> Request:
    method = draw(token)
    uri = draw(sip_uris)
    uri = SipUri(uri.scheme, uri.user, uri.password, uri.host, uri.port, uri.params, ())
    items = [
        (
            "Via",
            f"SIP/2.0/{draw(st.sampled_from(['UDP', 'TCP', 'TLS']))} {uri.host_port};branch=z9hG4bK{draw(token)}",
        ),
        ("From", f"<{draw(sip_uris)}>;tag={draw(token)}"),
        ("To", f'"{draw(header_value).replace(chr(92), "").replace(chr(34), "")}" <{draw(sip_uris)}>'),
        ("Call-ID", draw(token)),
        ("CSeq", f"{draw(st.integers(0, 2**31 - 1))} {method}"),
    ]
    extras = draw(
        st.lists(st.tuples(st.sampled_from(["Subject", "X-Thing", "User-Agent", "s"]), header_value))
    )
    order = draw(st.permutations(items + extras))
    return Request(method, str(uri), Headers(order), draw(st.binary(max_size=50)))


@fuzz
@given(requests())
def test_generated_requests_round_trip(request: Request) -> None:
    assert parse(serialize(request)) == request


# --- URIs and header helpers ------------------------------------------------------------------------------------

uri_like = st.one_of(
    st.text(max_size=60),
    st.builds(lambda s: "sip:" + s, st.text(alphabet="abc@:;=?&%[]0123456789.-_+~*'()/$,", max_size=40)),
    sip_uris.map(str),
)


@fuzz
@given(uri_like)
def test_parse_uri_raises_only_value_error_and_round_trips(text: str) -> None:
    try:
        uri = parse_uri(text)
    except ValueError:
        return
    assert parse_uri(str(uri)) == uri


@fuzz
@given(sip_uris)
def test_generated_uris_round_trip(uri: SipUri) -> None:
    assert parse_uri(str(uri)) == uri


helper_text = st.one_of(
    st.text(max_size=80),
    st.text(alphabet='SIP/2.0UDPhost;branch=z9 \t:"<>,@sip\\', max_size=60),
    st.sampled_from(
        [
            v
            for data in CORPUS
            for line in data.split(b"\r\n")
            if b":" in line
            for v in [line.partition(b":")[2]]
        ]
    ).map(lambda b: b.decode("utf-8", "replace")),
)


@fuzz
@given(helper_text)
def test_header_helpers_raise_only_value_error(text: str) -> None:
    try:
        via = parse_via(text)
    except ValueError:
        pass
    else:
        assert parse_via(str(via)) == via
    try:
        name_addr = parse_name_addr(text)
    except ValueError:
        pass
    else:
        assert parse_name_addr(str(name_addr)) == name_addr
    try:
        parse_cseq(text)
    except ValueError:
        pass


# --- SDP --------------------------------------------------------------------------------------------------------

sdp_bytes = st.one_of(
    st.binary(max_size=300),
    mutated(SDP_BODIES or [serialize_sdp(offer(LOCAL))]),
    st.just(serialize_sdp(offer(LOCAL))),
)


@fuzz
@given(sdp_bytes)
def test_sdp_raises_only_sdp_error_and_round_trips(data: bytes) -> None:
    try:
        description = parse_sdp(data)
    except SdpError:
        return
    assert parse_sdp(serialize_sdp(description)) == description
    hold_state(description)
    result = answer(description, LOCAL)
    if result is not None:
        assert parse_sdp(serialize_sdp(result.description)) == result.description
        assert len(result.description.media) == len(description.media)
