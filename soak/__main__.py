"""`python -m soak` (what `make soak` runs): see soak/run.py."""

import sys

from soak.run import main

sys.exit(main())
