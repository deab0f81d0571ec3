import sys

from gdngen.cli import main

sys.exit(main())
