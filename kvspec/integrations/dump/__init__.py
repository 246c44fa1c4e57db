"""Per-layer spec dumps (``tests/conformance/FORMAT.md``): what a running engine's
KV cache specs look like, and how kvspec brings them under version control.

* :mod:`.importer` -- a dump -> a readable kvspec source (``kvspec import``);
* :mod:`.read` -- a dump -> engine settings and layer specs, through that source.
"""
