"""The compiler passes, one module each, named after the function it exports.

Each pass is a pure function from its own frozen type to the next; the
types chain, each adding what its pass found to what came before::

    SourceText --compose--> Composed --parse--> Parsed --expand--> Expanded
      --validate--> Validated --plan--> Planned --size--> Sized --freeze--> Artifact

:mod:`kvspec.compiler` folds over them (``PASSES``), checks that the stage
types chain, and places every error the passes raise at its file, line and
column once (:mod:`kvspec.source.where`).
"""
