"""RFC 4475 (SIP torture test messages) against sip.core.message, sip.core.headers, sip.core.uri, sip.core.sdp and
sip.core.offer_answer.

The messages are read from ``/work/shared/corpus/rfc4475/{valid,invalid}/*.dat`` (from emiago/sipgo, BSD-2,
see LICENSE.sipgo there; used as test data in place, not copied; ``PARLORA_RFC4475_DIR`` points elsewhere, and
without the corpus these tests are skipped). sipgo files some messages that RFC 4475
calls valid, or valid with application-level consequences, under ``invalid/``; the table follows the RFC.

"Outcome" is what this bridge, a UAS, does with the datagram: a status is the response it sends (a
`ParseError` with `partial`, or a `check_request` rejection, or 488 from SDP offer/answer); "accept" means it
goes ahead (200 to OPTIONS, the INVITE is offered to the application with an SDP answer ready); "drop" means
no response can be built (`ParseError` without `partial`, counted); "response" means a response that parses and
goes to the transaction layer, which drops it for want of a matching client transaction.

| message    | RFC 4475 § | what it tests                                  | outcome  | why                                      |
|------------|------------|------------------------------------------------|----------|------------------------------------------|
| wsinv      | 3.1.1.1    | folding, LWS, compact forms, odd case          | accept   | parses; values below                     |
| intmeth    | 3.1.1.2    | every token character, quoted-pair CTLs        | 501      | parses; the method is unknown            |
| esc01      | 3.1.1.3    | %-escapes in URIs                              | accept   | user "sips:user@example.com"             |
| escnull    | 3.1.1.4    | %00 in URIs                                    | 405      | parses; REGISTER is not ours             |
| esc02      | 3.1.1.5    | % that is not an escape (method, header name)  | 501      | method is literally "RE%47IST%45R"       |
| lwsdisp    | 3.1.1.6    | no LWS between display name and <              | accept   | display "caller"                         |
| longreq    | 3.1.1.7    | long values, 34 Vias                           | accept   |                                          |
| dblreq     | 3.1.1.8    | a second message after Content-Length          | 405      | body is empty; REGISTER                  |
| semiuri    | 3.1.1.9    | ; in the user part                             | accept   | user "user;par=u@example.net"            |
| transports | 3.1.1.10   | unknown transports in Via                      | accept   | SCTP, TLS, UNKNOWN kept                  |
| mpart01    | 3.1.1.11   | multipart body with NULs                       | 405      | body framed (553 octets); MESSAGE        |
| unreason   | 3.1.1.12   | UTF-8 reason phrase                            | response |                                          |
| noreason   | 3.1.1.13   | empty reason phrase                            | response | reason ""                                |
| badinv01   | 3.1.2.1    | ;; and ,, in Via and Contact                   | drop     | the Via cannot be answered along         |
| clerr      | 3.1.2.2    | Content-Length larger than the datagram        | 400      |                                          |
| ncl        | 3.1.2.3    | negative Content-Length                        | 400      |                                          |
| scalar02   | 3.1.2.4    | CSeq, Max-Forwards, Expires too large          | 400      | "Bad CSeq header" (CSeq copied as is)    |
| scalarlg   | 3.1.2.5    | response with scalars too large                | drop     | a response: discarded                    |
| quotbal    | 3.1.2.6    | unterminated quoted string                     | drop     | To unusable                              |
| ltgtruri   | 3.1.2.7    | <> around the Request-URI                      | 400      |                                          |
| lwsruri    | 3.1.2.8    | LWS inside the Request-URI                     | 400      |                                          |
| lwsstart   | 3.1.2.9    | two SPs in the Request-Line                    | 400      |                                          |
| trws       | 3.1.2.10   | SP at the end of the Request-Line              | 400      |                                          |
| escruri    | 3.1.2.11   | escaped headers in the Request-URI             | 400      |                                          |
| baddate    | 3.1.2.12   | Date not in GMT                                | 400      | the RFC allows 400 (or ignoring Date)    |
| regbadct   | 3.1.2.13   | addr-spec with ? not in <>                     | 400      | "Bad Contact header"                     |
| badaspec   | 3.1.2.14   | spaces inside <>                               | drop     | To unusable                              |
| baddn      | 3.1.2.15   | unquoted comma in a display name               | drop     | From unusable                            |
| badvers    | 3.1.2.16   | SIP/7.0                                        | 505      |                                          |
| mismatch01 | 3.1.2.17   | CSeq method differs from the Request-Line      | 400      |                                          |
| mismatch02 | 3.1.2.18   | the same with an unknown method                | 400      |                                          |
| bigcode    | 3.1.2.19   | status code 4294967301                         | drop     | a response: discarded                    |
| badbranch  | 3.2.1      | branch is the bare magic cookie                | 400      | the RFC allows 400 or RFC 2543 matching  |
| insuf      | 3.3.1      | From, To, Call-ID missing                      | drop     | cannot be answered                       |
| unkscm     | 3.3.2      | unknown Request-URI scheme                     | 416      | parses                                   |
| novelsc    | 3.3.3      | known but atypical scheme (soap.beep)          | 416      | parses                                   |
| unksm2     | 3.3.4      | unknown schemes in To, From, Contact           | 405      | parses; REGISTER                         |
| bext01     | 3.3.5      | Require / Proxy-Require nobody supports        | 420      | Unsupported lists both Require tags      |
| invut      | 3.3.6      | unknown Content-Type                           | 415      | Accept: application/sdp                  |
| regaut01   | 3.3.7      | unknown Authorization scheme                   | 405      | parses; REGISTER                         |
| multi01    | 3.3.8      | several single-value headers                   | 400      |                                          |
| mcl01      | 3.3.9      | several Content-Length headers                 | 400      |                                          |
| bcast      | 3.3.10     | 200 with a broadcast Via                       | response | no matching transaction                  |
| zeromf     | 3.3.11     | Max-Forwards 0                                 | accept   | an endpoint processes it (483 under the  |
|            |            |                                                |          | UA's rule, see below)                    |
| cparam01   | 3.3.12     | Contact parameter on an addr-spec              | 405      | the parameter belongs to the header      |
| cparam02   | 3.3.13     | URI parameter inside <>                        | 405      | the parameter belongs to the URI         |
| regescrt   | 3.3.14     | escaped header in a Contact URI                | 405      | parses; REGISTER                         |
| sdp01      | 3.3.15     | Accept excludes application/sdp                | 406      |                                          |
| inv2543    | 3.4.1      | RFC 2543 syntax (no branch, no tag)            | accept   | the RFC asks for backward compatibility  |
| test       | (none)     | a loose INVITE from the archive, not in RFC    | drop     | no SIP version, a header line without : |

No message of the corpus gets a 2xx except those the RFC calls valid (and inv2543/zeromf, which it says to
process). With ``check_request(..., reject_zero_max_forwards=True)`` zeromf gets 483 instead (the
user agent's rule, sip/core/ua.py).
"""

from __future__ import annotations

import pytest

from sip.core.headers import NameAddr, parse_cseq, parse_name_addr, parse_via
from sip.core.message import ParseError, Request, Response, check_request, make_response, parse, serialize
from sip.core.offer_answer import LocalMedia, answer
from sip.core.sdp import parse_sdp
from sip.core.uri import parse_uri, uri_scheme
from tests.support.sip_rfc4475 import CORPUS

BRIDGE_METHODS = ("INVITE", "ACK", "BYE", "CANCEL", "OPTIONS", "INFO", "UPDATE", "REFER", "NOTIFY")
LOCAL = LocalMedia("192.0.2.99", 40000, 1)

OUTCOMES: dict[str, str | int] = {
    "valid/wsinv": "accept",
    "valid/intmeth": 501,
    "valid/esc01": "accept",
    "valid/escnull": 405,
    "valid/esc02": 501,
    "valid/lwsdisp": "accept",
    "valid/longreq": "accept",
    "valid/dblreq": 405,
    "valid/semiuri": "accept",
    "valid/transports": "accept",
    "valid/mpart01": 405,
    "valid/unreason": "response",
    "valid/noreason": "response",
    "invalid/badinv01": "drop",
    "invalid/clerr": 400,
    "invalid/ncl": 400,
    "invalid/scalar02": 400,
    "invalid/scalarlg": "drop",
    "invalid/quotbal": "drop",
    "invalid/ltgtruri": 400,
    "invalid/lwsruri": 400,
    "invalid/lwsstart": 400,
    "invalid/trws": 400,
    "invalid/escruri": 400,
    "invalid/baddate": 400,
    "invalid/regbadct": 400,
    "invalid/badaspec": "drop",
    "invalid/baddn": "drop",
    "invalid/badvers": 505,
    "invalid/mismatch01": 400,
    "invalid/mismatch02": 400,
    "invalid/bigcode": "drop",
    "invalid/badbranch": 400,
    "invalid/insuf": "drop",
    "invalid/unkscm": 416,
    "invalid/novelsc": 416,
    "invalid/unksm2": 405,
    "invalid/bext01": 420,
    "invalid/invut": 415,
    "invalid/regaut01": 405,
    "invalid/multi01": 400,
    "invalid/mcl01": 400,
    "invalid/bcast": "response",
    "invalid/zeromf": "accept",
    "invalid/cparam01": 405,
    "invalid/cparam02": 405,
    "invalid/regescrt": 405,
    "invalid/sdp01": 406,
    "invalid/inv2543": "accept",
    "invalid/test": "drop",
}

pytestmark = pytest.mark.skipif(not CORPUS.is_dir(), reason="the RFC 4475 corpus is not staged")


def _load(name: str) -> bytes:
    return (CORPUS / f"{name}.dat").read_bytes()


def _message(name: str) -> Request | Response:
    message = parse(_load(name))
    return message


def outcome(data: bytes, *, reject_zero_max_forwards: bool = False) -> str | int:
    """What the bridge does with this datagram (see the module docstring)."""
    try:
        message = parse(data)
    except ParseError as error:
        if error.partial is None:
            return "drop"
        make_response(error.partial, error.status, error.reason)  # must be buildable
        return error.status
    if isinstance(message, Response):
        return "response"
    rejection = check_request(
        message,
        allowed_methods=BRIDGE_METHODS,
        supported_options=("timer", "replaces"),
        reject_zero_max_forwards=reject_zero_max_forwards,
    )
    if rejection is not None:
        return rejection.status
    if message.method == "INVITE" and message.body:
        try:
            offer = parse_sdp(message.body)
        except ValueError:
            return 400
        if answer(offer, LOCAL) is None:
            return 488
    return "accept"


def test_the_table_covers_the_whole_corpus() -> None:
    files = {f"{path.parent.name}/{path.stem}" for path in CORPUS.glob("*/*.dat")}
    assert files == set(OUTCOMES)


def test_the_docstring_table_says_what_the_tests_check() -> None:
    rows = {}
    for line in (__doc__ or "").splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 5 and cells[0] and cells[0] != "message" and not cells[0].startswith("-"):
            rows[cells[0]] = cells[3]
    assert rows == {name.split("/")[1]: str(outcome) for name, outcome in OUTCOMES.items()}


@pytest.mark.parametrize(("name", "expected"), sorted(OUTCOMES.items()))
def test_outcome(name: str, expected: str | int) -> None:
    assert outcome(_load(name)) == expected


@pytest.mark.parametrize("name", sorted(n for n in OUTCOMES if n.startswith("valid/")))
def test_every_valid_message_parses_and_round_trips(name: str) -> None:
    message = _message(name)
    again = parse(serialize(message))
    assert again == message


@pytest.mark.parametrize(
    "name",
    sorted(n for n, o in OUTCOMES.items() if o in ("accept", "response") or isinstance(o, int) and o > 400),
)
def test_every_accepted_message_round_trips(name: str) -> None:
    try:
        message = _message(name)
    except ParseError:
        return  # 505 and the like: not a parsed message
    assert parse(serialize(message)) == message


@pytest.mark.parametrize("name", sorted(OUTCOMES))
def test_no_message_of_the_corpus_raises_anything_but_parse_error(name: str) -> None:
    data = _load(name)
    for cut in (len(data), len(data) // 2, 10):
        try:
            parse(data[:cut])
        except ParseError as error:
            assert 400 <= error.status <= 599


def test_zeromf_gets_483_under_issue_13s_rule() -> None:
    assert outcome(_load("invalid/zeromf"), reject_zero_max_forwards=True) == 483


# --- the values RFC 4475 says the valid messages carry ---------------------------------------------------------


def test_wsinv_values() -> None:
    message = _message("valid/wsinv")
    assert isinstance(message, Request)
    assert message.uri == "sip:vivekg@chair-dnrc.example.com;unknownparam"
    headers = message.headers
    to = parse_name_addr(headers.get("To") or "")
    assert to.uri == "sip:vivekg@chair-dnrc.example.com" and to.tag == "1918181833n"
    sender = parse_name_addr(headers.get("From") or "")
    assert sender.display == 'J Rosenberg \\"' and sender.tag == "98asjd8"
    assert headers.get("Max-Forwards") == "0068"
    assert parse_cseq(headers.get("CSeq") or "") == (9, "INVITE")
    vias = [parse_via(v) for v in headers.get_all("Via")]
    assert [(v.transport, v.host, v.branch) for v in vias] == [
        ("UDP", "192.0.2.2", "390skdjuw"),
        ("TCP", "spindle.example.com", "z9hG4bK9ikj8"),
        ("UDP", "192.168.255.111", "z9hG4bK30239"),
    ]
    assert headers.get("Subject") == ""
    assert headers.get("NewFangledHeader") == "newfangled value continued newfangled value"
    assert headers.get("UnknownHeaderWithUnusualValue") == ";;,,;;,;"
    contact = parse_name_addr(headers.get("Contact") or "")
    assert contact == NameAddr(
        'Quoted string ""',
        "sip:jdrosen@example.com",
        (("newparam", "newvalue"), ("secondparam", None), ("q", "0.33")),
    )
    route = parse_name_addr(headers.get("Route") or "")
    assert route.sip_uri.params == (("lr", None), ("unknownwith", "value"), ("unknown-no-value", None))
    assert len(message.body) == 150 and parse_sdp(message.body).media[0].formats == ("0", "12")


def test_intmeth_values() -> None:
    message = _message("valid/intmeth")
    assert isinstance(message, Request)
    assert message.method == "!interesting-Method0123456789_*+`.%indeed'~"
    uri = parse_uri(message.uri)
    assert uri.user == "1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*"
    assert uri.password == "&it+has=1,weird!*pas$wo~d_too.(doesn't-it)"
    to = parse_name_addr(message.headers.get("To") or "")
    assert to.display == "BEL:\x07 NUL:\x00 DEL:\x7f"
    sender = parse_name_addr(message.headers.get("From") or "")
    assert sender.display == "token1~` token2'+_ token3*%!.-" and sender.tag == "_token~1'+`*%!-."
    assert sender.param("fromParam''~+*_!.-%") == '"работающий"'
    assert message.headers.get("Call-ID") == "intmeth.word%ZK-!.*_+'@word`~)(><:\\/\"][?}{"
    assert parse_via(message.headers.get("Via") or "").branch == "z9hG4bK-.!%66*_+`'~"
    assert message.headers.get("extensionHeader-!.%*+_`'~") == "\ufeff大停電"


def test_esc01_values() -> None:
    message = _message("valid/esc01")
    assert isinstance(message, Request)
    assert parse_uri(message.uri).user == "sips:user@example.com"
    assert parse_name_addr(message.headers.get("To") or "").sip_uri.user == "user"
    assert parse_name_addr(message.headers.get("From") or "").sip_uri.user == "I have spaces"
    assert message.headers.get("Call-ID") == "esc01.239409asdfakjkn23onasd0-3234"  # compact "i"
    assert message.headers.get("Content-Type") == "application/sdp"  # compact "C"
    contact = parse_name_addr(message.headers.get("Contact") or "").sip_uri
    assert contact.user == "caller" and contact.params == (("lr", None), ("name", "value%41"))


def test_escnull_values() -> None:
    message = _message("valid/escnull")
    assert parse_name_addr(message.headers.get("To") or "").sip_uri.user == "null-\x00-null"
    contacts = [parse_name_addr(c).sip_uri.user for c in message.headers.get_all("Contact")]
    assert contacts == ["\x00", "\x00\x00"]


def test_esc02_values() -> None:
    message = _message("valid/esc02")
    assert isinstance(message, Request) and message.method == "RE%47IST%45R"
    assert parse_name_addr(message.headers.get("To") or "").display == "%Z%45"
    assert parse_via(message.headers.get("Via") or "").branch == "z9hG4bK209%fzsnel234"
    assert len(message.headers.get_all("Contact")) == 2  # C%6Fntact is another header
    assert message.headers.get("C%6Fntact") == "<sip:alias2@host2.example.com>"


def test_lwsdisp_longreq_dblreq_semiuri_transports() -> None:
    assert parse_name_addr(_message("valid/lwsdisp").headers.get("From") or "").display == "caller"
    longreq = _message("valid/longreq")
    assert len(longreq.headers.get_all("Via")) == 34
    long_param = parse_name_addr(longreq.headers.get("To") or "").sip_uri.params[-1]
    assert long_param[0].endswith("ParameterNameWithNoValue") and long_param[1] is None
    assert len(parse_via(longreq.headers.get_all("Via")[-1]).branch or "") > 200
    dblreq = _message("valid/dblreq")
    assert isinstance(dblreq, Request) and dblreq.method == "REGISTER" and dblreq.body == b""
    semiuri = _message("valid/semiuri")
    assert isinstance(semiuri, Request)
    uri = parse_uri(semiuri.uri)
    assert (uri.user, uri.host, uri.params) == ("user;par=u@example.net", "example.com", ())
    assert semiuri.headers.get_all("Accept")[-1] == "message/sipfrag"
    transports = _message("valid/transports")
    assert [parse_via(v).transport for v in transports.headers.get_all("Via")] == [
        "UDP",
        "SCTP",
        "TLS",
        "UNKNOWN",
        "TCP",
    ]


def test_mpart01_body_is_framed_exactly() -> None:
    message = _message("valid/mpart01")
    assert len(message.body) == 553 and b"\x00" in message.body
    assert message.body.startswith(b"--7a9cbec02ceef655") and message.body.rstrip().endswith(b"--")


def test_unreason_and_noreason() -> None:
    unreason = _message("valid/unreason")
    assert isinstance(unreason, Response) and unreason.status == 200
    assert unreason.reason.startswith("= 2**3 * 5**2 ") and "сто" in unreason.reason
    noreason = _message("valid/noreason")
    assert isinstance(noreason, Response) and (noreason.status, noreason.reason) == (100, "")


def test_unknown_schemes_parse_and_are_kept() -> None:
    unkscm = _message("invalid/unkscm")
    assert isinstance(unkscm, Request) and unkscm.uri == "nobodyKnowsThisScheme:totallyopaquecontent"
    novelsc = _message("invalid/novelsc")
    assert isinstance(novelsc, Request) and uri_scheme(novelsc.uri) == "soap.beep"
    unksm2 = _message("invalid/unksm2")
    assert parse_name_addr(unksm2.headers.get("To") or "").uri == "isbn:2983792873"
    assert parse_name_addr(unksm2.headers.get("From") or "").uri == "http://www.example.com"
    assert parse_name_addr(unksm2.headers.get("Contact") or "").uri == "name:John_Smith"


def test_cparam01_and_cparam02_put_the_parameter_in_different_places() -> None:
    header_param = parse_name_addr(_message("invalid/cparam01").headers.get("Contact") or "")
    assert header_param.uri == "sip:+19725552222@gw1.example.net" and header_param.params == (
        ("unknownparam", None),
    )
    uri_param = parse_name_addr(_message("invalid/cparam02").headers.get("Contact") or "")
    assert uri_param.params == () and uri_param.sip_uri.params == (("unknownparam", None),)


def test_regescrt_keeps_the_escaped_header_in_the_contact_uri() -> None:
    contact = parse_name_addr(_message("invalid/regescrt").headers.get("Contact") or "").sip_uri
    assert contact.headers == (("Route", "<sip:sip.example.com>"),)


def test_bext01_unsupported_lists_the_require_tags_only() -> None:
    message = _message("invalid/bext01")
    assert isinstance(message, Request)
    rejection = check_request(message)
    assert rejection is not None and rejection.headers == (
        ("Unsupported", "nothingSupportsThis, nothingSupportsThisEither"),
    )


def test_errors_name_the_header() -> None:
    reasons = {}
    for name in (
        "invalid/mismatch01",
        "invalid/multi01",
        "invalid/mcl01",
        "invalid/regbadct",
        "invalid/scalar02",
    ):
        with pytest.raises(ParseError) as info:
            parse(_load(name))
        reasons[name] = info.value.reason
    assert reasons["invalid/mismatch01"].startswith("Bad CSeq header")
    assert reasons["invalid/multi01"].startswith("Multiple ")
    assert reasons["invalid/mcl01"] == "Multiple Content-Length headers"
    assert reasons["invalid/regbadct"] == "Bad Contact header"
    assert reasons["invalid/scalar02"] == "Bad CSeq header"


def test_inv2543_is_accepted_with_rfc2543_via_and_no_tag() -> None:
    message = _message("invalid/inv2543")
    via = parse_via(message.headers.get("Via") or "")
    assert via.branch is None and parse_name_addr(message.headers.get("From") or "").tag is None
    assert "Max-Forwards" not in message.headers
    offer = parse_sdp(message.body)
    result = answer(offer, LOCAL)
    assert result is not None and result.media.codec == "PCMU"
