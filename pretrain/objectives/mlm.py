"""Masked language modelling: the head on masked rows only (``--objective mlm``; packed shards).
Every answer is :class:`~pretrain.objectives.base.Objective`'s default."""

from __future__ import annotations

from bertforge.pretrain.model.specs import MLM as SPEC
from bertforge.pretrain.objectives.base import Objective

OBJECTIVE = Objective(SPEC)
