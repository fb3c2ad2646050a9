"""The command line: the only layer that parses flags, prints, or exits."""
