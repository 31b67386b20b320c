"""``python -m trioha`` delegates to the CLI room."""

from trioha.cli import main

main()
