"""The `parlora-bridge` command: its subcommands, the one options table and config file, doctor."""
