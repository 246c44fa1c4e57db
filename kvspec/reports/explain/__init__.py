"""``kvspec explain``: what a layout does with memory, for a terminal, a pull
request (Markdown) or a browser (HTML with pictures).

The report is plain frozen data (:class:`Report`) computed from the artifact's
frozen body (:mod:`kvspec.artifact.format`); Jinja2 templates shipped in
``kvspec/reports/templates`` render it. A source is compiled and frozen first (and
re-planned for ``--memory``); an artifact is read as ``load`` reads it, and its
capacity for ``--memory`` read from its body (:func:`kvspec.artifact.sizing.capacity_for`).

* :mod:`.subject` -- loading a source or an artifact for a budget;
* :mod:`.frozen` -- the body as the report reads it (a separate plan's pools each
  on their own);
* :mod:`.capacity` -- what a budget holds, and the sweep over budgets;
* :mod:`.blockmap` -- where each layer sits inside one block, waste by cause;
* :mod:`.report` -- the report's rows and warnings;
* :mod:`.pictures` -- the block as text, the HTML report's block picture (for a
  laptop's width and a phone's);
* :mod:`.chart` -- the HTML report's capacity chart;
* :mod:`.render` -- the Jinja2 environment and its filters.

One block of the main pool, as the report draws it: every group's layers sit
in *slots* of the block, and slot *i* of every group is the same bytes — a
block id belongs to one group at a time. For a block held by group ``g``::

    bytes_per_block = useful(g)          # the group's unpadded pages
                    + padded_pages(g)    # page_size_padded - unpadded page
                    + padding_slots(g)   # bytes other groups use, g leaves empty
                    + alignment          # bytes no group uses (block-stride alignment)

Waste is weighted by how many blocks each group takes for one request at
``max_model_len`` (its ``blocks_per_request``): the share of a full-length
request's blocks that holds no KV state.

>>> rep = explain("layouts/llama-3.1-8b.yaml")
>>> rep.groups[0].kind, rep.groups[0].layers, rep.capacity.num_blocks
('full_attention', ('model.layers.{0..31}.self_attn.attn',), 20480)
>>> rep.waste.total, rep.warnings
(0, ())
"""

from __future__ import annotations

from kvspec.reports.explain.blockmap import BlockMap, Segment, Waste, block_map
from kvspec.reports.explain.capacity import (
    SWEEP_POINTS,
    Capacity,
    capacity,
    min_memory,
    sweep,
)
from kvspec.reports.explain.pictures import ascii_block, block_picture, capacity_chart
from kvspec.reports.explain.render import (
    FORMATS,
    arrow,
    environment,
    group_padding,
    pages_text,
    render,
)
from kvspec.reports.explain.report import (
    WASTE_WARNING,
    GroupRow,
    PoolRow,
    Report,
    StageRow,
    Warning_,
    WasteRow,
    build_report,
    explain,
)
from kvspec.reports.explain.subject import Subject, is_artifact_path, read_subject
from kvspec.reports.format import compact_layers

__all__ = [
    "FORMATS",
    "SWEEP_POINTS",
    "WASTE_WARNING",
    "BlockMap",
    "Capacity",
    "GroupRow",
    "PoolRow",
    "Report",
    "Segment",
    "StageRow",
    "Subject",
    "Warning_",
    "Waste",
    "WasteRow",
    "arrow",
    "ascii_block",
    "block_map",
    "block_picture",
    "build_report",
    "capacity",
    "capacity_chart",
    "compact_layers",
    "environment",
    "explain",
    "group_padding",
    "is_artifact_path",
    "read_subject",
    "min_memory",
    "pages_text",
    "render",
    "sweep",
]
