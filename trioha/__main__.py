"""``python -m trioha`` delegates to the CLI module."""

from trioha._cli import main

main()
