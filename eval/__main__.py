"""``python -m eval run | promote | validate | summary`` (see :mod:`eval.cli`)."""

import sys

from training.extra import MissingExtraError

try:
    from .cli import main
except MissingExtraError as exc:  # without the train extra: the install hint, not a traceback
    sys.exit(f"error: {exc}")

sys.exit(main())
