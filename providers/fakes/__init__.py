"""Faithful local provider servers for tests and for the embedded echo provider.

Each fake speaks a provider's real wire protocol on loopback, runs a deterministic scripted model, and
records every client frame so tests can assert on what the bridge actually sent.

The kit every fake is built from: `server` (the WebSocket shell, the records, one `serving()` for every
module's `serve()`), `connection` (the connection base: records and notes, the outbound, close and fault
funnels, half-open, holding), `schema` (the one JSON schema validator), `echo` (the energy detector, the
utterance detector and the media clock that paces replies), `speech` (the response engine: a reply's audio in
chunks, paced, its words riding along), `faults`, `script`, and `kit_openai` (what the
OpenAI-shaped fakes share: the client event table, the error answer, base64 audio in). The vendor modules keep
only their wire vocabulary and model: `openai_live` (GPT-Live), `realtime_family` with its dialects
`openai_realtime` and `xai`, and `gemini_live`.
"""
