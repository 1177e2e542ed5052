"""Provider adapters (one module per wire protocol) and, in `providers.fakes`, faithful local servers.

Adapters may use `rtp`'s audio primitives (G.711, audio formats) and nothing else of `rtp` or `sip`.
"""
