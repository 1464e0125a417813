"""``python -m peers`` runs the whole ``bcpbus`` command (:mod:`peers.cli`)."""

import sys

from .cli import main

sys.exit(main())
