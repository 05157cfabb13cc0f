"""``python -m vultrscale.cli``."""

from vultrscale.cli import main

main()
