"""parlora-bridge: phone calls to realtime speech-to-speech AI.

The embedding API (bridge/server/api.py) is available from the package: `bridge.Server`, `bridge.ServerConfig`,
`bridge.Application`, `bridge.CallSetup`, `bridge.LiveCall`, with `bridge.JobRequest` and `bridge.ToolSpec`
(and `bridge.DoNotCall`, `bridge.RetryPolicy`, `bridge.Disclosure` for placed calls and disclosures).
It is imported on first use, so the session engine's modules load without the SIP engine.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Server": "bridge.server.api",
    "ServerConfig": "bridge.server.api",
    "Application": "bridge.server.api",
    "CallSetup": "bridge.server.api",
    "LiveCall": "bridge.server.api",
    "DoNotCall": "bridge.server.api",
    "RetryPolicy": "bridge.engine.dial_retry",
    "Disclosure": "bridge.engine.disclosure",
    "JobRequest": "bridge.engine.delegations",
    "ToolSpec": "providers.base",
    "TelephonyOptions": "bridge.engine.telephony",
    "RolloverOptions": "bridge.engine.rollover",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        from importlib import import_module

        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bridge' has no attribute {name!r}")
