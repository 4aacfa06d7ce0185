import sys

from kljax.cli import main

sys.exit(main())
