import sys

from hpcdp.cli import main

sys.exit(main())
