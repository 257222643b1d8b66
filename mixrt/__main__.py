"""``python -m mixrt``: the same as the ``mixrt`` command."""

import sys

from mixrt.cli import main

sys.exit(main())
