"""An attacker's first tools against a live `serve` guarded by digest alone (sip/core/guard.py), live: Debian's
sipvicious (`svmap`, `svwar`, `svcrack`) in compact mode (`-c`: no User-Agent, so the scanner blocklist does
not see them), against user 1001 with the weak password "letmein", inside a private network namespace
(`unshare --net`, loopback up) so that nothing the tools or the bridge send can leave the machine.

- svmap and svwar learn no product name: no Server field, and the realm is the bridge's address.
- svcrack with INVITE (a dictionary with the password 10th) gets 5 guesses answered, then the source is banned:
  it hears nothing more, gives up after its 10 s of silence and does not find the password; the bridge logs one
  ban line (source, user, count) and never the password.
- svcrack with REGISTER (its default) gets 405 to its very first request, as to any: it never gets a challenge
  to answer, so no answer can tell it a right password from a wrong one.

svcrack 0.3.3 crashes on a SHA-256 challenge (it reads only the first WWW-Authenticate field: its pattern eats
the CRLF that starts the next one); the test runs a copy in its tmp_path with that pattern fixed to read every
field and answer the MD5 one, never the system file. The outer test re-runs this module inside the namespace
(the environment variable below marks the inner run).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import peers

INNER = "PARLORA_GUESSER_NETNS"
HERE = Path(__file__).resolve().parent
SIPVICIOUS = Path("/usr/share/sipvicious/sipvicious")  # Debian's package keeps the modules here
USER, PASSWORD = "1001", "letmein"
WRONG = ("123456", "password", "1001", "qwerty", "abc123", "admin", "welcome", "monkey", "dragon")


def test_sipvicious_learns_nothing_and_is_slowed_down_in_a_network_namespace() -> None:
    # tests/run.sh installs Debian's sipvicious: a missing peer fails here, it does not skip
    assert shutil.which("svmap") is not None and SIPVICIOUS.is_dir(), "sipvicious is not installed"
    peers.rerun_in_netns(HERE / "test_guesser_live.py", INNER, 3, timeout=240)


def _inner() -> None:
    peers.inner_only(INNER)


def _guarded(start_bridge):  # type: ignore[no-untyped-def]
    return start_bridge(
        "--provider", "echo", "--inbound-auth", USER, env={"PARLORA_INBOUND_PASSWORD": PASSWORD}
    )


def _tool(argv: list[str], timeout: float = 60) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return proc.stdout + proc.stderr


def _svcrack(tmp_path: Path, *args: str) -> str:
    """The patched copy of svcrack (see the module docstring), run by the system's Python as Debian's is."""
    copy = tmp_path / "sv"
    if not copy.exists():
        shutil.copytree(SIPVICIOUS, copy / "sipvicious")
        helper = copy / "sipvicious" / "libs" / "svhelper.py"
        text = helper.read_text()
        old = "nonceRE = '\\r\\n(www-authenticate|proxy-authenticate): (.+?)\\r\\n'"
        assert old in text, "svhelper.getAuthHeader changed: look again at the SHA-256 crash"
        text = text.replace(old, "nonceRE = '\\r\\n(www-authenticate|proxy-authenticate): (.+?)(?=\\r\\n)'")
        text = text.replace(
            "return(_tmp[0][1])\n    return None\n\n\n\ndef check_ipv6",
            "return([h for _, h in _tmp if 'algorithm=md5' in h.lower()] or [_tmp[0][1]])[0]\n"
            "    return None\n\n\n\ndef check_ipv6",
        )
        helper.write_text(text)
    dictionary = tmp_path / "passwords.txt"
    dictionary.write_text("\n".join((*WRONG, PASSWORD, "sunshine")) + "\n")
    argv = ["svcrack", "-c", "-vv", "-u", USER, "-d", str(dictionary), *args]
    code = f"import sys; sys.path.insert(0, {str(copy)!r}); sys.argv = {argv!r}; "
    code += "from sipvicious.svcrack import main; main()"
    return _tool(["/usr/bin/python3", "-c", code], timeout=90)


def test_inner_svmap_and_svwar_learn_no_product_name(start_bridge) -> None:  # type: ignore[no-untyped-def]
    _inner()
    bridge = _guarded(start_bridge)
    port = str(bridge.sip_port)
    svmap = _tool(["svmap", "-c", "-vv", "-p", port, "127.0.0.1"])
    # it found the bridge (the OPTIONS was answered) and could not name it
    assert re.search(rf"\|\s*127\.0\.0\.1:{port}\s*\|\s*unknown\s*\|", svmap), svmap[-3000:]
    svwar = _tool(["svwar", "-c", "-vv", "-e", "1000-1002", "-p", port, "127.0.0.1"])
    svwar_invite = _tool(["svwar", "-c", "-vv", "-m", "INVITE", "-e", "1000-1002", "-p", port, "127.0.0.1"])
    for output in (svmap, svwar, svwar_invite):
        assert "parlora" not in output.lower(), output[-3000:]
    for output in (svwar, svwar_invite):  # no extension told apart from another
        assert "found nothing" in output and not re.search(rf"\|\s*{USER}\s*\|", output), output[-3000:]


def test_inner_svcrack_with_invite_gets_five_guesses_then_silence(  # type: ignore[no-untyped-def]
    start_bridge, tmp_path: Path
) -> None:
    _inner()
    bridge = _guarded(start_bridge)
    output = _svcrack(tmp_path, "-m", "INVITE", "-p", str(bridge.sip_port), "127.0.0.1")
    assert "trying 123456" in output, output[-3000:]  # it did guess
    assert PASSWORD not in output and "The password for" not in output, output[-3000:]
    assert "seconds since we last received a response" in output, output[-3000:]  # silence made it give up
    bans = re.findall(r"digest auth: source (\S+) banned for (\d+) s after (\d+) failures.*", bridge.log)
    assert bans == [("127.0.0.1", "600", "5")], bridge.log[-3000:]
    assert f"last user '{USER}'" in bridge.log
    assert PASSWORD not in bridge.log and "response=" not in bridge.log


def test_inner_svcrack_with_register_never_gets_a_challenge(  # type: ignore[no-untyped-def]
    start_bridge, tmp_path: Path
) -> None:
    _inner()
    bridge = _guarded(start_bridge)
    output = _svcrack(tmp_path, "-p", str(bridge.sip_port), "127.0.0.1")
    # 405 to its first, credential-less REGISTER: it stops there, having tried no password
    assert "unknown response" in output and "trying 123456" not in output, output[-3000:]
    assert PASSWORD not in output, output[-3000:]
    assert "banned" not in bridge.log
