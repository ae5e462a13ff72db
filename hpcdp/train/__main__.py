import sys

from hpcdp.train.command import main

sys.exit(main())
