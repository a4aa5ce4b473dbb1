"""``python -m pretrain.export``, the same as ``bertforge export``."""

import sys

from bertforge.pretrain.export.hf_export import main

sys.exit(main())
