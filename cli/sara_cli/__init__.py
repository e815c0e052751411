"""The `sara` command line: one module per command, above every library of the project
(:mod:`sara_cli.main` builds the command and is the console entry point)."""
