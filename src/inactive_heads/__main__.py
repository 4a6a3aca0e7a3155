"""``python -m inactive_heads``: the command-line tool."""

import sys

from .cli import main

sys.exit(main())
