"""``python -m pretrain.plot``, the same as ``bertforge plot``."""

import sys

from bertforge.pretrain.plot import main

sys.exit(main())
