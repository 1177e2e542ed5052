"""Signalling: the call-leg contract `bridge` sees (`sip.leg`), the engine seam and registry (`sip.engine`),
the SIP rules every engine shares (`sip.core.identity`, `sip.core.telephony`, `sip.core.transfer`) and the engines behind
the seam (`sip.pjsua2.agent`, the optional pjsua2 extra). Nothing here imports `bridge` or `providers`, and
importing this package imports no engine."""
