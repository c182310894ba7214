"""``python -m rasterflow``."""

from rasterflow.cli import main

main()
