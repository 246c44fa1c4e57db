"""The planner: layer specs -> groups -> placement -> sizing -> the Layout IR.

Its public face (what the passes, the reports and the artifact reader use):

* :func:`plan_layers` -- a memory-independent :class:`~kvspec.model.plan.Plan`;
* :func:`size_plan` -- a plan sized for a budget (auto-fit, one-request check,
  blocks, capacity, block sizes): a :class:`Sizing`;
* :func:`build_layout` -- the :class:`~kvspec.model.plan.Layout` an artifact holds;
* :func:`blocks_for` / :func:`resize` -- a compiled layout sized for another
  budget.

Everything else (``group``, ``place``, ``size``, ``strategies``) is internal.
"""

from kvspec.planner.layout import build_layout
from kvspec.planner.plan import plan_layers
from kvspec.planner.size import Sizing, blocks_for, min_blocks_to_serve, resize, size_plan

__all__ = ["Sizing", "blocks_for", "build_layout", "min_blocks_to_serve", "plan_layers",
           "resize", "size_plan"]
