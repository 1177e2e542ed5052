"""The default SIP engine's asyncio shells: UDP/TCP/TLS transports and the engine around `sip.core`."""
