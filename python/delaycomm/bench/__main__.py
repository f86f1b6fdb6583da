"""Entry point of ``python -m delaycomm.bench`` (see :mod:`delaycomm.bench.cli`)."""

import sys

from delaycomm.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
