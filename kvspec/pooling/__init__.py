"""The pooling policy's decision: a driver above the compiler (CONTRIBUTING.md 17).

:func:`decide` takes the pool pass's place when :mod:`kvspec.compiler` runs the
pipeline, for a source that asks for a policy other than ``unified`` or declares a
workload:

* the candidates (:mod:`.candidates`) -- vLLM's plan (the unified plan, always, as
  the baseline); for ``separate``, the separate plan; for ``auto``, every plan the
  runtime named by ``serve_with`` can serve: unified plans at other block sizes
  (vLLM and kvspec), and the separate plan (kvspec's runtime only) -- each the
  source compiled again through the pipeline with other settings, and frozen;
* each one's capacity: statically (:mod:`.figures`) and, with a budget, its
  artifact simulated at the workload (:mod:`.evaluate`: the request trace replayed
  through kvspec's manager and scheduler model);
* the choice (:mod:`.choose`): ``unified`` and ``separate`` keep what they ask
  for; ``auto`` keeps the candidate that runs the most requests on average (within
  1% of the best is a tie), ties to the finer prefix-match unit (prefix caching
  kept on), then to the smaller layout waste while memory binds, then to fewer
  groups.

Everything lands in the artifact's ``pooling`` record, so the choice is reviewable.
The passes import nothing of this package.
"""

from __future__ import annotations

from kvspec.passes.pool import PoolLayout, separate_layouts
from kvspec.pooling.candidates import Candidate
from kvspec.pooling.decide import check_pool, decide, precheck

__all__ = ["Candidate", "PoolLayout", "check_pool", "decide", "precheck", "separate_layouts"]
