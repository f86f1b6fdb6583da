"""``python -m delaycomm.sim``: see ``--help`` and docs/sim.md."""

import sys

from delaycomm.sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
