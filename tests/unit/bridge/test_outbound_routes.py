"""Outbound calls under a configuration file: their own routes (never an inbound one), the defaults when none
matches, a route named by the request, and the trunk they go out on with its own credentials
(bridge/cli/config.py "Directions", bridge/server/dialing.py, bridge/cli/ops.py RoutedApplication, bridge/server/api.py Server.dial)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bridge.cli.config import ConfigError, load, select_route
from bridge.cli.ops import RoutedApplication, server_config
from bridge.server.api import Application, CallRefused, CallSetup, Server, ServerConfig
from bridge.server.dialing import DialTrunk, choose_trunk, dial_target
from sip.core.identity import call_identity
from sip.engine import EngineFeatures
from sip.leg import CallIdentity

FILE = """
[defaults]
provider = "echo"
instructions = "default words"
greeting = "Say: hello from the defaults."
[[trunks]]
name = "office"
allow = ["192.0.2.0/24"]
[[trunks]]
name = "carrier"
registrar = "sip:acct@sip.carrier.example"
auth_user = "acct-auth"
password_env = "CARRIER_PASSWORD"
[[trunks]]
name = "backup"
registrar = "sip:other@backup.example:5080"
auth_user = "other"
password_env = "BACKUP_PASSWORD"
[[routes]]
name = "reception"
number = "4930100"
instructions = "inbound reception words"
greeting = "Say: reception, how can I help?"
[[routes]]
name = "reminders"
direction = "outbound"
pattern = "_49301XX"
instructions = "outbound reminder words"
greeting = "Say: this is your appointment reminder."
[[routes]]
name = "surveys"
direction = "outbound"
instructions = "outbound survey words"
greeting = "Say: a short survey."
"""
# reminders matches 4930100 too (the reception's number): an outbound call to it is a reminder, never reception

ENV = {"CARRIER_PASSWORD": "carrier-secret", "BACKUP_PASSWORD": "backup-secret"}


def _file(tmp_path: Path, text: str = FILE) -> Path:
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    return path


def _outbound(target: str) -> CallIdentity:
    """A placed call's identity as the native engine makes it."""
    return call_identity(
        "out-1",
        request_uri=target,
        from_uri="sip:bridge@127.0.0.1",
        to_uri=target,
        sip_call_id="out-1",
        source="127.0.0.1:5099",
        headers=(("X-Direction", "outbound"),),
        direction="outbound",
    )


def _inbound(called: str, headers: tuple[tuple[str, str], ...] = ()) -> CallIdentity:
    return call_identity(
        "in-1",
        request_uri=f"sip:{called}@bridge.example",
        from_uri="sip:caller@x",
        to_uri=f"sip:{called}@bridge.example",
        sip_call_id="in-1",
        source="192.0.2.7:5060",
        headers=headers,
    )


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- route selection ------------------------------------------------------------------------------------------


def test_an_outbound_call_to_an_inbound_routes_number_gets_the_outbound_route(tmp_path: Path) -> None:
    app = RoutedApplication(Application(), load(_file(tmp_path)))
    setup: CallSetup = _run(app.setup_outbound(_outbound("sip:4930100@127.0.0.1:5090"), None))
    assert (setup.route, setup.instructions, setup.greeting) == (
        "reminders",
        "outbound reminder words",
        "Say: this is your appointment reminder.",
    )
    inbound: CallSetup = _run(app.setup(_inbound("4930100")))  # the same number called in: reception
    assert (inbound.route, inbound.instructions) == ("reception", "inbound reception words")


def test_an_outbound_call_never_gets_an_inbound_route_even_with_only_inbound_routes(tmp_path: Path) -> None:
    text = FILE.split('[[routes]]\nname = "reminders"')[0]  # the reception route alone
    app = RoutedApplication(Application(), load(_file(tmp_path, text)))
    setup: CallSetup = _run(app.setup_outbound(_outbound("sip:4930100@127.0.0.1"), None))
    assert (setup.route, setup.instructions, setup.greeting) == (
        None,
        "default words",
        "Say: hello from the defaults.",
    )


def test_an_unmatched_outbound_call_gets_the_defaults_not_404(tmp_path: Path) -> None:
    text = FILE.split('[[routes]]\nname = "surveys"')[0]  # no outbound catch-all
    app = RoutedApplication(Application(), load(_file(tmp_path, text)))
    setup: CallSetup = _run(app.setup_outbound(_outbound("sip:+15550001@127.0.0.1"), None))
    assert (setup.route, setup.instructions, setup.greeting) == (
        None,
        "default words",
        "Say: hello from the defaults.",
    )
    with pytest.raises(CallRefused) as refused:  # inbound keeps its rule: no match among inbound routes, 404
        _run(app.setup(_inbound("+15550001")))
    assert refused.value.status == 404


def test_the_server_routes_a_placed_call_as_outbound_and_an_answered_one_as_inbound(tmp_path: Path) -> None:
    """Server._run_call hands a leg whose identity says "outbound" to `setup_outbound`, never to `setup`
    (which matched the callee's number against the inbound routes)."""
    seen: list[tuple[str, str | None]] = []

    class Recorder(Application):
        async def setup(self, call: CallIdentity) -> CallSetup:
            seen.append(("setup", None))
            raise CallRefused(404, "stop here")

        async def setup_outbound(self, call: CallIdentity, route: str | None) -> CallSetup:
            seen.append(("setup_outbound", route))
            raise CallRefused(404, "stop here")

    class Leg:
        def __init__(self, identity: CallIdentity) -> None:
            self.identity = identity
            self.hung: list[int | None] = []

        def hangup(self, reason: str, status: int | None = None) -> None:
            self.hung.append(status)

    async def run() -> None:
        server = Server(Recorder(), ServerConfig())
        await server._run_call(Leg(_outbound("sip:4930100@127.0.0.1")), None, "surveys")  # type: ignore[arg-type]
        await server._run_call(Leg(_inbound("4930100")))  # type: ignore[arg-type]

    _run(run())
    assert seen == [("setup_outbound", "surveys"), ("setup", None)]


def test_a_caller_cannot_claim_to_be_an_outbound_call_by_a_header(tmp_path: Path) -> None:
    app = RoutedApplication(Application(), load(_file(tmp_path)))
    setup: CallSetup = _run(app.setup(_inbound("4930100", (("X-Direction", "outbound"),))))
    assert setup.route == "reception"


def test_an_outbound_call_may_name_its_route(tmp_path: Path) -> None:
    app = RoutedApplication(Application(), load(_file(tmp_path)))
    app.check_outbound("sip:4930100@127.0.0.1", "surveys")
    setup: CallSetup = _run(app.setup_outbound(_outbound("sip:4930100@127.0.0.1"), "surveys"))
    assert (setup.route, setup.instructions) == ("surveys", "outbound survey words")


def test_naming_an_inbound_or_unknown_route_refuses_the_call_before_it_is_placed(tmp_path: Path) -> None:
    app = RoutedApplication(Application(), load(_file(tmp_path)))
    with pytest.raises(ValueError, match="reception.*inbound route.*reminders, surveys"):
        app.check_outbound("sip:4930100@127.0.0.1", "reception")
    with pytest.raises(ValueError, match="no route has that name"):
        app.check_outbound("sip:4930100@127.0.0.1", "nope")
    with pytest.raises(ValueError, match="no routes to name"):  # no file: nothing to name
        Application().check_outbound("sip:4930100@127.0.0.1", "surveys")


def test_select_route_matches_only_routes_of_the_calls_direction(tmp_path: Path) -> None:
    routes = load(_file(tmp_path)).routes
    assert select_route(routes, "4930100").name == "reception"  # type: ignore[union-attr]
    assert select_route(routes, "4930100", direction="outbound").name == "reminders"  # type: ignore[union-attr]
    assert select_route(routes, "4930199").__class__ is type(None)  # inbound: no catch-all, no match
    assert select_route(routes, "4930999", direction="outbound").name == "surveys"  # type: ignore[union-attr]


def test_route_direction_is_checked_and_catch_alls_are_per_direction(tmp_path: Path) -> None:
    both = """
[[routes]]
name = "in-all"
[[routes]]
name = "out-all"
direction = "outbound"
"""
    config = load(_file(tmp_path, both))  # an inbound catch-all does not shadow an outbound route
    assert [r.direction for r in config.routes] == ["inbound", "outbound"]
    bad = """
[[routes]]
name = "sideways"
direction = "sideways"
[[routes]]
name = "out-header"
direction = "outbound"
header = { name = "X-Line", value = "a" }
"""
    with pytest.raises(ConfigError) as error:
        load(_file(tmp_path, bad))
    text = str(error.value)
    assert "routes[0].direction: expected one of inbound, outbound" in text
    assert "routes[1].header: an outbound route has no header" in text


# --- the trunk an outbound call goes out on ---------------------------------------------------------------------


def test_trunk_by_name_by_target_host_and_a_bare_number_by_the_first_with_a_registrar(tmp_path: Path) -> None:
    trunks = load(_file(tmp_path)).trunks
    assert choose_trunk(trunks, "sip:1@anywhere.example", "backup").name == "backup"  # type: ignore[union-attr]
    by_host = choose_trunk(trunks, "sip:+4930555@SIP.carrier.example:5060")
    assert by_host is not None and by_host.name == "carrier"
    assert choose_trunk(trunks, "sip:+1555@backup.example").name == "backup"  # type: ignore[union-attr]
    assert choose_trunk(trunks, "sip:200@192.0.2.9").name == "office"  # type: ignore[union-attr]  # allow CIDR
    assert choose_trunk(trunks, "+4930555").name == "carrier"  # type: ignore[union-attr]
    assert choose_trunk([t for t in trunks if t.registrar is None], "+4930555") is None
    # A host that is no trunk's goes direct: no trunk's digest answer reaches a stranger's challenge.
    assert choose_trunk(trunks, "sip:200@198.51.100.1") is None
    with pytest.raises(ValueError, match="trunk 'nope': no trunk has that name .*office, carrier, backup"):
        choose_trunk(trunks, "sip:1@x", "nope")


def test_a_number_is_dialled_at_its_trunks_registrar() -> None:
    carrier = DialTrunk("carrier", "sip:acct@sip.carrier.example:5070;transport=tcp")
    assert dial_target("+4930555", carrier) == "sip:+4930555@sip.carrier.example:5070;transport=tcp"
    assert dial_target("sip:1@elsewhere", carrier) == "sip:1@elsewhere"
    with pytest.raises(ValueError, match="name a trunk with a registrar"):
        dial_target("+4930555", DialTrunk("office", allow=("192.0.2.0/24",)))


class _Dialer:
    """A native-engine stand-in that records what `Server.dial` asked of it."""

    features = EngineFeatures(dial=True)

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []

    async def dial(self, target: str, **kwargs: Any) -> Any:
        self.asked.append({"target": target, **kwargs})

        class Leg:
            identity = _outbound(target)

        return Leg()

    def drain(self) -> None:  # the rest of SipEngine is not reached here
        pass


def _dial(tmp_path: Path, **kwargs: Any) -> tuple[dict[str, Any], list[str | None]]:
    config = load(_file(tmp_path))
    server = Server(RoutedApplication(Application(), config), server_config(config, ENV))
    dialer, routes = _Dialer(), []
    server._agent = dialer  # type: ignore[assignment]
    server._on_call = lambda leg, route=None, lead_frames=None: routes.append(route)  # type: ignore[method-assign]
    _run(server.dial(**kwargs))
    return dialer.asked[0], routes


def test_each_trunk_answers_challenges_with_its_own_credentials(tmp_path: Path) -> None:
    asked, routes = _dial(tmp_path, to="sip:+1555@backup.example", route="surveys")
    assert (asked["auth_user"], asked["password"]) == ("other", "backup-secret")
    assert asked["from_uri"] == "sip:other@backup.example"  # the account's identity, as carriers want
    assert routes == ["surveys"]
    asked, _ = _dial(tmp_path, to="sip:+4930555@sip.carrier.example")
    assert (asked["auth_user"], asked["password"]) == ("acct-auth", "carrier-secret")
    asked, _ = _dial(tmp_path, to="+4930555", trunk="backup", from_uri="sip:me@x")
    assert asked["target"] == "sip:+4930555@backup.example:5080" and asked["from_uri"] == "sip:me@x"
    asked, _ = _dial(tmp_path, to="sip:200@192.0.2.9")  # the office trunk has no credentials: none are given,
    assert asked["password"] == ""  # not the carrier's (the engine's "" means none, None the registration's)


def test_an_unknown_trunk_or_route_sends_nothing(tmp_path: Path) -> None:
    for kwargs in ({"trunk": "nope"}, {"route": "reception"}):
        with pytest.raises(ValueError):
            _dial(tmp_path, to="sip:1@127.0.0.1", **kwargs)
