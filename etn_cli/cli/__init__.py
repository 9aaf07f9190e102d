"""The command line: ``etn`` and its commands (typer), options and refusals."""
