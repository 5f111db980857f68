"""The subcommands of ``killpoint``, one module each, imported only when chosen."""
