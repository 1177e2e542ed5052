"""The media edge: G.711, audio frames and formats, the outbound playout queue and the carrier ledger.

Nothing here imports `sip`, `providers` or `bridge`; `providers` may use the audio primitives.
"""
