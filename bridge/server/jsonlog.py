"""`serve --log-format json`: one JSON object per line, secrets never written.

Each line has `time` (UTC, ISO 8601 with milliseconds), `level`, `logger`, `message`, `event` (the message's
template: the same for every line of one kind, so a log system can group on it) and `call_id` when the line
is about a call (a `call_id` given in `extra`, else the "call ID" or "call-N" the bridge's messages start
with); an exception's traceback goes in `exc`. For a call the server knows (`CALLS`: opened when the call
arrives, closed when it is over), the line also has `sip_call_id` (the INVITE's Call-ID) and, once the call's
config route was chosen, `route`.

Secrets: the values of the environment variables that hold keys, passwords, tokens and secrets (by name:
`*_API_KEY`, `*PASSWORD*`, `*TOKEN*`, `*SECRET*`) are read when the formatter is made and replaced by `***`
wherever they would appear, whatever logged them. Nothing the bridge logs carries a key on purpose; this is the
second line of defence.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

REDACTED = "***"
_SECRET_NAME = re.compile(r"(_API_KEY$|PASSWORD|TOKEN|SECRET)", re.IGNORECASE)
# "call ID ..." (the session's lines) or "call-N ..." (the SIP engine's, which name the call by its id alone)
_CALL_ID = re.compile(r"^(?:call (\S+?)|(call-\d+)):?(?:\s|$)")
_MIN_SECRET_LEN = 4  # shorter values would redact ordinary words


def secret_values(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The values of the variables whose names say they hold a secret (longest first)."""
    values = {v for k, v in environ.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET_LEN}
    return tuple(sorted(values, key=len, reverse=True))


class CallContext:
    """What the log knows of each live call by the bridge's call id: its SIP Call-ID and route. Entries live as
    long as the call (the server opens and closes them), so the table never grows with traffic."""

    def __init__(self) -> None:
        self._calls: dict[str, dict[str, str]] = {}

    def open(self, call_id: str, sip_call_id: str) -> None:
        self._calls[call_id] = {"sip_call_id": sip_call_id}

    def route(self, call_id: str, route: str) -> None:
        entry = self._calls.get(call_id)
        if entry is not None:
            entry["route"] = route

    def close(self, call_id: str) -> None:
        self._calls.pop(call_id, None)

    def get(self, call_id: str) -> Mapping[str, str]:
        return self._calls.get(call_id, {})

    def __len__(self) -> int:
        return len(self._calls)


CALLS = CallContext()  # the process's calls (bridge.server.api.Server opens and closes them)


class JsonFormatter(logging.Formatter):
    def __init__(self, secrets: Iterable[str] = (), calls: CallContext = CALLS) -> None:
        super().__init__()
        self._secrets = tuple(secrets)
        self._calls = calls

    def _clean(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
            "event": str(record.msg),
        }
        call_id = getattr(record, "call_id", None)
        if call_id is None and (m := _CALL_ID.match(message)) is not None:
            call_id = m.group(1) or m.group(2)
        if call_id is not None:
            line["call_id"] = str(call_id)
            line.update(self._calls.get(str(call_id)))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return self._clean(json.dumps(line, ensure_ascii=False, default=str))


def use_json_logs(environ: Mapping[str, str] | None = None) -> None:
    """Switch every handler of the root logger to JSON lines (after `logging.basicConfig`)."""
    formatter = JsonFormatter(secret_values(os.environ if environ is None else environ))
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
