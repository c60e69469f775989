"""One module per ``netdiag`` subcommand (see ``netdiag.cli.COMMANDS``)."""
