"""``python -m rasterflow.sample DIR [--size N] [--dates N] [--tiles RxC] ...``

The parser lives in :mod:`rasterflow.sample.cli` (re-exported as ``rasterflow.sample.main``), so importing the package
never imports this module, which ``python -m`` runs as ``__main__``.
"""

import sys

from rasterflow.sample.cli import main

if __name__ == "__main__":
    sys.exit(main())
