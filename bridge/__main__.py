"""`python -m bridge` is `parlora-bridge`."""

from bridge.cli import main

main()
