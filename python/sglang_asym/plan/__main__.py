"""Entry point of `python -m sglang_asym.plan` (see plan/cli.py)."""

import sys

from .cli import main

sys.exit(main())
