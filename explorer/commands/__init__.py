"""The explorer's command-line subcommands: `report`, `diff`, `convert` and `whatif`."""
