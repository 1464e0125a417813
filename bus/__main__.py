"""``python -m bus`` runs the ``bcpbus`` command."""

import sys

from .cli import main

sys.exit(main())
