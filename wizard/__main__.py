"""`python -m wizard` runs the npu-wizard command."""

import sys

from wizard.cli import main

sys.exit(main())
