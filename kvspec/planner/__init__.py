"""The planner: layer specs -> groups -> placement -> sizing -> the Layout IR.

Its public face (what the artifact reader and the reports may use):

* :func:`plan_layers` -- a memory-independent :class:`~kvspec.model.plan.Plan`;
* :func:`resolve` -- a plan settled for a budget (auto-fit, one-request check,
  blocks, capacity, block sizes);
* :func:`layout_of` -- the :class:`~kvspec.model.plan.Layout` an artifact holds;
* :func:`blocks_for` / :func:`resize` -- a compiled layout sized for another
  budget.

Everything else (``group``, ``place``, ``size``, ``strategies``) is internal.
"""

from kvspec.planner.layout import layout_of
from kvspec.planner.plan import plan_layers
from kvspec.planner.resolve import (
           Resolved,
           blocks_for,
           min_blocks_to_serve,
           resize,
           resolve,
)

__all__ = ["Resolved", "blocks_for", "layout_of", "min_blocks_to_serve", "plan_layers",
           "resize", "resolve"]
