"""The server: the asyncio shells around the engine (session, Server and the Python API, HTTP, console,
browser channel, webhook, records, recording, metrics, logs)."""
