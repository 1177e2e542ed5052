"""`python -m bridge` is `parlora-bridge`."""

from bridge.cli.commands import main

main()
