import sys

from driftscope.cli import main

sys.exit(main())
