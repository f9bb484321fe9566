"""`python -m emo.cli ...`: the same as the `emo` command."""

import sys

from emo.cli import main

sys.exit(main())
