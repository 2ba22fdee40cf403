"""``python -m prescaler.cli``: the same as the ``prescaler`` console script."""

import sys

from prescaler.cli import main

sys.exit(main())
