import sys

from .methods import main

sys.exit(main())
