import sys

from conclave.cli import main

sys.exit(main())
