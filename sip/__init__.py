"""Signalling: the call-leg contract `bridge` sees (`sip.leg`), the engine seam and registry (`sip.engine`),
the SIP rules every engine shares (`sip.identity`, `sip.telephony`, `sip.transfer`) and the engines behind
the seam (`sip.pjsua2_agent`, the optional pjsua2 extra). Nothing here imports `bridge` or `providers`, and
importing this package imports no engine."""
