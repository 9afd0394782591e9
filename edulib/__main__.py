"""`python -m edulib ...`: the same entry points as the `edulib` command (torchrun uses this form)."""

import sys

from edulib.cli import main

sys.exit(main())
