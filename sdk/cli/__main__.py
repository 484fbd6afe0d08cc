"""``python -m popgate.cli``: the `popgate` command."""

import sys

from .main import main

sys.exit(main())
