"""``python -m pretrain.plot``."""

import sys

from bertforge.pretrain.plot import main

sys.exit(main())
