"""The `lowtide` command. One module per command group; main.py wires them together."""
