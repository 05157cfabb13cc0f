"""``python -m vultrscale``."""

from vultrscale.cli import main

main()
