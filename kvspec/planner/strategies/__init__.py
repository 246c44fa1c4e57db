"""Grouping strategies, one module each, tried in the reference planner's order.

Each exports a function of its own name, ``(engine, specs, log) -> groups``
(None: the model is not of its shape). The groups it makes record the
strategy's name (and the role of each group in it), so placement and sizing
read it back instead of re-detecting it:

1. ``uniform`` -- one spec for every layer: one group;
2. ``uniform_type`` -- one type (same token slots), different pages: one group;
3. ``state_slots`` -- MLA + compressed indexer + state layers (GLM-5-Next):
   state layers share the MLA layers' slots, a drafter may have its own pool;
4. ``packed`` -- a block-outermost axis order with mixed page sizes;
5. ``hybrid_page`` -- page unification, then equal-size groups with padding
   slots; ``hidden_state`` caches are appended last;
6. ``full_allocation`` -- MLA + sliding window whose pages cannot be unified:
   sliding-window layers allocated as full attention.

With the hybrid manager off, local attention is first promoted to full
allocation (:mod:`.promote`).
"""
