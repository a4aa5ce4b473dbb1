"""``python -m pretrain.doctor``, as ``bertforge doctor``: see :mod:`pretrain.doctor.cli`."""

import sys

from bertforge.pretrain.doctor.cli import main

sys.exit(main())
