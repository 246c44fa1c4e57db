"""The compiler passes, one module each, named after the function it exports.

Each pass is a pure function from its own frozen type to the next; the
types chain, each adding what its pass found to what came before::

    SourceText --compose--> Composed --parse--> Parsed --expand--> Expanded
      --validate--> Validated --plan--> Planned --size--> Sized --pool--> Pooled
      --freeze--> Artifact

:mod:`.pipeline` holds them as data (``PASSES``) and folds over any sequence that
chains (``run``), placing every error the passes raise at its file, line and
column once (:mod:`kvspec.source.where`). The ``pool`` pass simulates nothing:
a policy that weighs candidates is a driver above the passes (:mod:`kvspec.pooling`,
which :mod:`kvspec.compiler` runs in its place); nothing here imports it, the
simulator or the runtime.
"""
