"""Faithful local provider servers for tests and for the embedded echo provider.

Each fake speaks a provider's real wire protocol on loopback, runs a deterministic scripted model, and
records every client frame so tests can assert on what the bridge actually sent.
"""
