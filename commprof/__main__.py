"""``python -m commprof``: the same as the ``commprof`` console script."""

import sys

from commprof.cli import main

sys.exit(main())
