"""``python -m delaycomm.experiment``: see ``--help`` and docs/experiment.md."""

import sys

from delaycomm.experiment.cli import main

if __name__ == "__main__":
    sys.exit(main())
