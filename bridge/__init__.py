"""parlora-bridge: phone calls to realtime speech-to-speech AI.

The embedding API (bridge/api.py) is available from the package: `bridge.Server`, `bridge.ServerConfig`,
`bridge.Application`, `bridge.CallSetup`, `bridge.LiveCall`, with `bridge.JobRequest` and `bridge.ToolSpec`.
It is imported on first use, so the session engine's modules load without the SIP engine.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Server": "bridge.api",
    "ServerConfig": "bridge.api",
    "Application": "bridge.api",
    "CallSetup": "bridge.api",
    "LiveCall": "bridge.api",
    "JobRequest": "bridge.delegations",
    "ToolSpec": "providers.base",
    "TelephonyOptions": "bridge.telephony",
    "RolloverOptions": "bridge.rollover",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        from importlib import import_module

        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bridge' has no attribute {name!r}")
