import sys

from rapidfire_nb.cli import main

sys.exit(main())
