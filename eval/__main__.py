"""``python -m eval run | promote | validate | summary`` (see :mod:`eval.cli`)."""

import sys

from .cli import main

sys.exit(main())
