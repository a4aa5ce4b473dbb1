"""``python -m pretrain.export``."""

import sys

from pretrain.export.hf_export import main

sys.exit(main())
