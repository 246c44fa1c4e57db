"""The validate pass: checks across fields and layers that the schema cannot make.

Run on the expanded source; every problem is reported together, each at the
line and column of the value it is about.

* a model needs at least one layer;
* ``quantization.skip_layers`` must name decoder layers the model has;
* every pipeline stage must own at least one layer.
"""

from __future__ import annotations

from kvspec.errors import KvspecError, raise_all
from kvspec.source.document import Document
from kvspec.source.expand import Expansion
from kvspec.source.schema import Source


def _layers(source: Source, doc: Document, ex: Expansion) -> list[KvspecError]:
    if ex.layers:
        return []
    return [doc.error("the model has no layers that hold a KV cache", ("layers",),
                      expected="at least one layer entry, e.g. "
                               "- {repeat: 32, pattern: [full]}",
                      found="no layers" if not source.layers else "only '-' pattern items",
                      hint="list the model's attention and state layers under layers:")]


def _skip_layers(source: Source, doc: Document, ex: Expansion) -> list[KvspecError]:
    indices = {layer.index for layer in ex.layers if layer.index is not None}
    errors: list[KvspecError] = []
    for i, idx in enumerate(source.quantization.skip_layers):
        if idx not in indices:
            shown = f"{min(indices)}..{max(indices)}" if indices else "none"
            errors.append(doc.error(
                f"quantization.skip_layers names decoder layer {idx}, which has no KV cache "
                "layer", ("quantization", "skip_layers", i),
                expected=f"decoder-layer indices of this model ({shown})", found=str(idx),
                hint="skip_layers takes the index N of model.layers.N"))
    return errors


def _stages(source: Source, doc: Document, ex: Expansion) -> list[KvspecError]:
    pp = source.parallel.pipeline
    if pp == 1 or not ex.layers:
        return []
    empty = [i for i, stage in enumerate(ex.stage_specs) if not stage]
    if not empty:
        return []
    total = ex.engine.total_num_hidden_layers
    return [doc.error(
        f"{pp} pipeline stages but stage {empty[0]} owns no layer: the model has "
        f"{total} decoder layers" if total is not None else
        f"{pp} pipeline stages, but stage {empty[0]} owns no layer",
        ("parallel", "pipeline"), expected=f"at most {total} stages, each owning a layer"
        if total is not None else "stages that each own a layer", found=str(pp),
        hint="lower parallel.pipeline, or set parallel.pipeline_partition")]


CHECKS = (_layers, _skip_layers, _stages)


def validate_source(source: Source, doc: Document, ex: Expansion) -> None:
    """Raise every problem the checks find, together; nothing when there is none."""
    raise_all(e for check in CHECKS for e in check(source, doc, ex))
