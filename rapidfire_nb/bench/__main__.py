"""``python -m rapidfire_nb.bench``: the same as ``rapidfire bench``."""

import sys

from rapidfire_nb.bench.cli import main

sys.exit(main())
