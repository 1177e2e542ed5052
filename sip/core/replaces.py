"""Attended transfer by REFER with Replaces (RFC 5589 §7, RFC 3891, RFC 3515): the pure parts, shared by the
engines. No I/O.

- `accepts_replaces(invite)`: whether a caller's side can be asked to replace a dialog. Its INVITE declared the
  extension (`Supported: replaces`, or `Require: replaces`, RFC 3891 §6.1) and it takes a REFER: its `Allow`
  lists REFER, or it sent no `Allow` at all. Chosen where the RFCs are silent: a missing Allow is not a refusal
  (RFC 3261 §20.5 makes the header optional, and many phones that support Replaces omit it); a REFER it then
  refuses (405, 501) only costs the fallback to the relay.
- `replaces_refer_to(dialog)`: the Refer-To for the transferee — the target's contact URI (the remote target of
  our dialog with it) with a `Replaces` URI header naming that dialog as the target sees it (RFC 3891 §3: the
  recipient matches `to-tag` to its local tag, `from-tag` to its remote one; we placed that call, so `to-tag`
  is the target's tag and `from-tag` ours), escaped as a URI header value (RFC 3261 §19.1.1, RFC 3891 §5: `;`,
  `=`, `@` as %3B, %3D, %40).
- `parse_replaces(refer_to)`: the contact URI and the `DialogId` (from the target's view) back out of one.
"""

from __future__ import annotations

from dataclasses import replace

from sip.core.dialog import Dialog, DialogId
from sip.core.headers import split_list
from sip.core.message import Request
from sip.core.uri import parse_uri

REPLACES = "replaces"


def accepts_replaces(invite: Request) -> bool:
    """The INVITE's sender may be sent a REFER whose target carries Replaces (see the module's docstring)."""
    options = {
        token.strip().lower()
        for name in ("Supported", "Require")
        for value in invite.headers.get_all(name)
        for token in split_list(value)
    }
    if REPLACES not in options:
        return False
    allow = [m.strip().upper() for value in invite.headers.get_all("Allow") for m in split_list(value)]
    return not allow or "REFER" in allow


def replaces_refer_to(dialog: Dialog) -> str:
    """The Refer-To URI that makes the transferee replace `dialog` (one we placed, confirmed) at its far end.
    ValueError when the dialog's remote target is not a SIP URI we can print."""
    uri = parse_uri(dialog.remote_target)
    if uri.scheme not in ("sip", "sips"):
        raise ValueError(f"remote target {dialog.remote_target!r} is not a sip: or sips: URI")
    # the far end's view: its local tag is our remote tag
    value = f"{dialog.id.call_id};to-tag={dialog.id.remote_tag};from-tag={dialog.id.local_tag}"
    return str(replace(uri, headers=(("Replaces", value),)))


def parse_replaces(refer_to: str) -> tuple[str, DialogId] | None:
    """The contact URI (without the header) and the dialog that `refer_to`'s Replaces names, as its recipient
    holds it (`local_tag` = to-tag); None without a well-formed Replaces."""
    try:
        uri = parse_uri(refer_to.strip().removeprefix("<").removesuffix(">"))
    except ValueError:
        return None
    found = [value for name, value in uri.headers if name.lower() == REPLACES]
    if len(found) != 1:
        return None
    call_id, _, rest = found[0].partition(";")
    tags = dict(p.partition("=")[::2] for p in rest.split(";") if p)
    to_tag, from_tag = tags.get("to-tag"), tags.get("from-tag")
    if not call_id or not to_tag or not from_tag:
        return None
    return str(replace(uri, headers=())), DialogId(call_id, to_tag, from_tag)
