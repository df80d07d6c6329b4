"""`python -m tailwatch` runs the command line."""

import sys

from tailwatch.cli import main

sys.exit(main())
