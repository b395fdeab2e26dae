"""The `ssmport` command line: one small module per subcommand over library functions."""
