"""`python -m gradzip.sweep`: the same as gradzip-sweep."""

import sys

from . import main

sys.exit(main())
