"""``python -m pretrain.export``."""

import sys

from bertforge.pretrain.export.hf_export import main

sys.exit(main())
