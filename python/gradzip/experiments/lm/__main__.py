"""``python -m gradzip.experiments.lm``."""

import sys

from ._cli import main

sys.exit(main())
