import sys

from madsl.cli import main

sys.exit(main())
