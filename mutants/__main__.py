"""`python -m mutants`: the property library against the planted-bug catalogue (the kill matrix)."""

import sys

from .campaign import main

sys.exit(main())
