"""`serve --log-format json` (issue 15): one JSON object per line, secrets never written.

Each line has `time` (UTC, ISO 8601 with milliseconds), `level`, `logger`, `message`, `event` (the message's
template: the same for every line of one kind, so a log system can group on it) and `call_id` when the line
is about a call (a `call_id` given in `extra`, else the "call ID" the bridge's messages start with); an
exception's traceback goes in `exc`.

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
_CALL_ID = re.compile(r"^call (\S+?):?(?:\s|$)")
_MIN_SECRET_LEN = 4  # shorter values would redact ordinary words


def secret_values(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The values of the variables whose names say they hold a secret (longest first)."""
    values = {v for k, v in environ.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET_LEN}
    return tuple(sorted(values, key=len, reverse=True))


class JsonFormatter(logging.Formatter):
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self._secrets = tuple(secrets)

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
            call_id = m.group(1)
        if call_id is not None:
            line["call_id"] = str(call_id)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return self._clean(json.dumps(line, ensure_ascii=False, default=str))


def use_json_logs(environ: Mapping[str, str] | None = None) -> None:
    """Switch every handler of the root logger to JSON lines (after `logging.basicConfig`)."""
    formatter = JsonFormatter(secret_values(os.environ if environ is None else environ))
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
