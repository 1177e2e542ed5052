"""Harnesses the tests share: fakes, virtual-time calls, peers' drivers and their constants."""
