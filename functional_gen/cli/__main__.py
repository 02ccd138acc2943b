"""`python -m functional_gen.cli ...`: the `functional-gen` program."""

import sys

from . import console_main

sys.exit(console_main())
