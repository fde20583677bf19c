import sys

from syncopate.cli import main

sys.exit(main())
