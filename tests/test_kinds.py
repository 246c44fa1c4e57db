"""The layer-kind registry, and merges derived from the fields' rules.

* every kind is declared once and every table derives from the registry;
* ``merge([s, s]) == s`` for every kind;
* for every kind and every field, two layers that differ only in that field
  merge as the field's rule says (agree -> conflict, any -> or, window -> the
  one window or invalid);
* the fp8 MLA + sliding-window-MLA model the old hand-written merges got wrong.
"""

from __future__ import annotations

import dataclasses
import typing
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.compiler import compile_source
from kvspec.model import kinds
from kvspec.model.specs import MergeConflict, MergeInvalid, UniformType, layer_specs
from kvspec.model.specs.base import merge_fields
from kvspec.source.schema import LayerKind
from tests.conftest import ROOT

DECLARABLE = [k for k in kinds.KINDS if k.spec is not UniformType]


def test_every_kind_once_and_the_tables_derive_from_it() -> None:
    names = [k.name for k in kinds.KINDS]
    assert len(names) == len(set(names))
    assert len({k.spec for k in kinds.KINDS}) == len(kinds.KINDS)
    assert typing.get_args(LayerKind) == kinds.SOURCE_KIND_NAMES
    for k in kinds.KINDS:
        assert k.spec.kind == k.name and kinds.by_name(k.name) is k and kinds.of(k.spec) is k
        assert set(k.required) <= set(kinds.spec_fields(k.name))


def _base(kind: kinds.Kind, block: int, heads: int, head: int) -> object:
    """A valid spec of ``kind`` with the given geometry."""
    if kind.state:
        return kind.spec(block_size=block, shapes=((3, head), (heads, 8, 8)),
                         dtypes=("bfloat16", "float32"))
    kw: dict[str, object] = dict(block_size=block, num_kv_heads=1 if kind.latent else heads,
                                 head_size=head, dtype="bfloat16")
    for name in kind.required:
        kw[name] = 4 * block
    return kind.spec(**kw)


def _other(value: object) -> list[object]:
    """Values a field may take instead of ``value``."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, (int, Fraction)):
        return [value * 2, value + 1]
    if value is None:
        return [4096, 64, "sparse"]
    if isinstance(value, str):
        return [value + "x", "deepseek_v4"]
    if isinstance(value, tuple):
        return [value[:1]] if len(value) > 1 else []
    return []


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(DECLARABLE), block=st.sampled_from([16, 64, 128]),
       heads=st.integers(1, 8), head=st.sampled_from([64, 128, 576]))
def test_merge_of_a_spec_with_itself_is_the_spec(kind, block, heads, head) -> None:
    s = _base(kind, block, heads, head)
    assert kind.spec.merge([s, s]) == s
    assert kind.spec.merge([s, dataclasses.replace(s)]) == s


@pytest.mark.parametrize("kind", DECLARABLE, ids=lambda k: k.name)
def test_every_field_merges_by_its_rule(kind) -> None:
    s = _base(kind, 16, 2, 128)
    rules = dict(merge_fields(type(s)))
    checked = 0
    for f in dataclasses.fields(s):
        if not f.init:
            continue
        for value in _other(getattr(s, f.name)):
            try:
                t = dataclasses.replace(s, **{f.name: value})
            except (TypeError, ValueError, ZeroDivisionError):
                continue
            if t == s:
                continue
            how = f.metadata.get("merge", "agree")
            assert rules[f.name].__name__ == f"_{how}"
            try:
                merged = kind.spec.merge([s, t])
            except MergeConflict:
                assert how == "agree", (kind.name, f.name)
            except MergeInvalid:
                assert how == "window" and None not in (getattr(s, f.name), value)
            else:
                assert how != "agree", f"{kind.name}.{f.name} merged two different values"
                want = (getattr(s, f.name) or value) if how == "any" else \
                    next(v for v in (getattr(s, f.name), value) if v is not None)
                assert getattr(merged, f.name) == want
            checked += 1
    assert checked > 3


FP8_MLA = """kvspec: 1
name: fp8-mla-swa
engine: {block_size: 64, max_model_len: 8192, memory: 8GiB}
quantization: {kv_cache_dtype: fp8}
defaults: {num_kv_heads: 1, head_size: 576, dtype: bfloat16}
layer_types:
  mla: {kind: mla}
  swa: {kind: sliding_window_mla, sliding_window: 128, alignment: 576}
layers:
  - {repeat: 4, pattern: [mla, swa]}
"""


def test_fp8_mla_and_sliding_window_mla_keep_their_quantization() -> None:
    art = compile_source(FP8_MLA, "fp8.yaml")
    layout = art.layout
    assert not layout.needs_zeroing  # one precision everywhere: nothing to zero
    for g in layout.groups:
        for s in ([m for _, m in g.spec.members] if isinstance(g.spec, UniformType)
                  else [g.spec]):
            assert s.kv_quant_mode == 1 and s.cache_dtype_str == "fp8"
            assert s.dtype == "float8_e4m3fn"
            if s.kind == "sliding_window_mla":
                assert s.alignment == 576


SINK_HALF = (ROOT / "tests" / "data" / "vllm" / "sink-half.yaml").read_text()


def test_sink_layers_with_several_states_per_token_form_one_group() -> None:
    """The reference's (and vLLM 0.33.0's) ``SinkFullAttentionSpec.merge`` drops
    ``tokens_per_state``, so its same-spec check fails for identical layers:
    kvspec merges them (docs/deviations.md, 3)."""
    layout = compile_source(SINK_HALF, "sink.yaml").layout
    (group,) = layout.groups
    assert len(group.layer_names) == 6 and not isinstance(group.spec, UniformType)
    assert group.spec.tokens_per_state == Fraction(1, 2) and group.spec.sink_len == 4


SWA_MLA_HYBRID_OFF = (ROOT / "tests" / "data" / "vllm" / "swa-mla-hybrid-off.yaml"
                      ).read_text()


def test_sliding_window_mla_with_the_hybrid_manager_off_is_one_mla_group() -> None:
    """The reference's promotion copies ``bounded_replay`` into ``MLAAttentionSpec``,
    which lacks it (a TypeError): kvspec allocates the sliding-window MLA layers as
    MLA layers, in one group (docs/deviations.md, 6)."""
    layout = compile_source(SWA_MLA_HYBRID_OFF, "off.yaml").layout
    (group,) = layout.groups
    assert len(group.layer_names) == 14
    assert {s.kind for s in layer_specs(group.spec)} == {"mla"}
    windows = {s.sliding_window for s in layer_specs(group.spec)}
    assert windows == {4096}  # the window is kept for compute (a merge keeps the one window)
