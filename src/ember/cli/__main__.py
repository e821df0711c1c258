"""``python -m ember.cli`` = ``ember``."""

import sys

from ember.cli.main import main

sys.exit(main())
