"""The pooling policy's decision: candidates, their capacity at the workload, the choice.

:func:`decide` is what the pool pass (:mod:`kvspec.passes.pool`) runs when a source
asks for a policy other than ``unified`` or declares a workload:

* the candidates -- vLLM's plan (the unified plan, always, as the baseline); for
  ``separate``, the separate plan; for ``auto``, every plan the runtime named by
  ``serve_with`` can serve: unified plans at other block sizes (vLLM and kvspec),
  and the separate plan (kvspec's runtime only);
* each one's capacity: statically (:mod:`.figures`) and, with a budget, simulated
  at the workload (:mod:`.evaluate`: the request trace replayed through kvspec's
  manager and scheduler model);
* the choice: ``unified`` and ``separate`` keep what they ask for; ``auto`` keeps
  the candidate that runs the most requests on average (within 1% of the best is
  a tie), ties to the finer prefix-match unit (prefix caching kept on), then to
  the smaller layout waste while memory binds, then to fewer groups.

Everything lands in the artifact's ``pooling`` record, so the choice is reviewable.
"""

from __future__ import annotations

from kvspec.pooling.decide import Candidate, decide, precheck
from kvspec.pooling.layouts import PoolLayout, separate_layouts

__all__ = ["Candidate", "PoolLayout", "decide", "precheck", "separate_layouts"]
