import sys

from model._cli import main

sys.exit(main())
