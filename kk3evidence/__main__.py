"""``python -m kk3evidence`` runs the CLI."""

from .cli import main

main()
