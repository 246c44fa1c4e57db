"""Fuzz inputs for kvspec, and the oracle that judges what kvspec does with them.

Three generators, each a plain function of a :class:`random.Random` (so the
benchmark runs them fast and reproducibly), with a Hypothesis strategy beside it
that hands them a ``Random`` from a drawn 64-bit seed (the same spread of cases as
the benchmark; Hypothesis's own ``st.randoms`` leans to the first choice of each
draw, mostly byte-level edits):

* :func:`mutate_source` -- a seed source (``layouts/*.yaml``, ``tests/errors/*.yaml``,
  ``tests/data/**/*.yaml``) with one to three mutations of its bytes or text:
  bit flips, line deletion and duplication, truncation, deep nesting, huge numbers,
  wrong types, YAML escapes (lone surrogates), tags (``!!timestamp``,
  ``!!python/...``), anchors and aliases, key renames, ``layer_name`` templates
  (``{index.x}``, ``{index[0]}``), extreme pipeline and tensor sizes, many keys,
  fields of any type added to layer types and sections (``tokens_per_state: '1/0'``);
* :func:`mutate_dump` -- a per-layer spec dump (``tests/conformance/cases/*.json``)
  with its types changed, keys dropped or renamed, values nested, numbers as
  strings, layer entries as numbers, and a few text-level edits;
* :func:`valid_source` -- a source meant to be valid, over every layer kind, every
  axis order (:class:`~kvspec.model.axes.AxisOrder`), quantization modes, the
  state/attention aliasing layout with a drafter, EAGLE/MTP drafters, pipeline,
  tensor and decode-context parallelism, ``mamba_cache_mode`` and hybrid on/off.

The oracle (:func:`check_cli`, :func:`check_valid`) runs kvspec in-process and
returns an :class:`Outcome`: ``ok``, ``clean`` (a refusal whose messages meet the
bar) or ``defect`` with a category. The bar for a refusal: exit 1 or 2, no
``Traceback``; every message starts ``FILE:LINE:COL: error:`` when its problem has
a position in the input (a YAML or JSON syntax error, a byte that is not UTF-8, or
an ``at:`` path that names a node of the input) and ``FILE: error:`` otherwise,
and carries a ``hint:`` line (how to put it right).

Where vLLM 0.33.0 is installed, :func:`check_against_vllm` is a differential
oracle: a generated source that compiles is checked with ``kvspec verify
--against vllm``, and any difference no by-design rule explains is a defect.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import re
import signal
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------
# seeds
# ---------------------------------------------------------------------------


def source_seeds(root: Path = ROOT) -> list[tuple[str, bytes]]:
    """Every seed source: (path relative to the repository, its bytes)."""
    files = sorted(root.glob("layouts/*.yaml")) + sorted(root.glob("tests/errors/*.yaml")) \
        + sorted(root.glob("tests/data/**/*.yaml"))
    return [(str(p.relative_to(root)), p.read_bytes()) for p in files]


def dump_seeds(root: Path = ROOT) -> list[tuple[str, bytes]]:
    """Every conformance case, as a dump to mutate."""
    return [(str(p.relative_to(root)), p.read_bytes())
            for p in sorted(root.glob("tests/conformance/cases/*.json"))]


def config_seeds(root: Path = ROOT) -> list[tuple[str, bytes]]:
    """Every Hugging Face config.json of tests/data/hf, for ``kvspec init``."""
    return [(str(p.relative_to(root)), p.read_bytes())
            for p in sorted(root.glob("tests/data/hf/*.json"))]


# ---------------------------------------------------------------------------
# values a mutation puts in
# ---------------------------------------------------------------------------

HUGE = ["0", "-1", "-0", "1e308", "1e999", ".inf", "-.inf", ".nan", "0x7fffffffffffffff",
        "9223372036854775808", "18446744073709551617", str(10**40), "1_000_000", "0o777",
        "2147483648", "4096", "4097", "1000000000", "3.5", "1e3", "007", "+16"]
WRONG = ["true", "false", "null", "~", "[]", "{}", "'8'", "\"16\"", "[1, 2]", "{a: 1}",
         "!!binary aGVsbG8=", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "''", "yes", "no",
         "on", "'auto'", "auto", "40GiB,", "40,000,000,000", "-5GiB", "1.5GiB", "inf GiB",
         "[[1, 2], [3]]", "{kind: full_attention}", "|\n  block\n", ">-\n  folded\n"]
ESCAPES = ["\\ud800", "\\udfff", "\\ud83d\\ude00", "\\U0001F600", "\\x00", "\\0", "\\uFFFE",
           "\\uFEFF", "\\x85", "\\u2028", "\\e", "\\N", "\\_", "\\L", "\\P", "\\x9f"]
TAGS = ["!!timestamp", "!!python/object:os.system", "!!python/name:os.system",
        "!!python/object/apply:os.system", "!!python/tuple", "!!int", "!!float", "!!str",
        "!!bool", "!!null", "!!binary", "!!set", "!!omap", "!!pairs", "!!map", "!!seq",
        "!custom", "!<tag:yaml.org,2002:int>", "!!merge", "!!value", "!!python/module:os"]
TEMPLATES = ["{index.x}", "{index[0]}", "{index.real}", "{index!r}", "{index!s}", "{index:>5}",
             "{index:x}", "{index:%}", "{index:s}", "{}", "{0}", "{name}", "{index}{index}",
             "{{index}}", "{index.__class__}", "{index.__class__.__mro__}", " {index",
             "index}", "{index[-1]}", "{index:0{index}}", "{ index }", "{index:d}", "",
             "model.layers.{index}", "{index}.{index}", "x" * 300 + "{index}", "{índex}"]
KEYS = ["kvspec", "name", "model", "description", "layer_name", "engine", "parallel",
        "defaults", "quantization", "layer_types", "layers", "block_size", "max_model_len",
        "model_max_len", "memory", "num_blocks", "layout", "hybrid", "mamba_cache_mode",
        "mamba_block_size", "tensor", "pipeline", "decode_context", "pipeline_partition",
        "num_hidden_layers", "kind", "num_kv_heads", "head_size", "dtype", "repeat",
        "pattern", "type", "index", "sliding_window", "shapes", "dtypes", "draft",
        "kv_cache_dtype", "skip_layers", "<<", "prefix_match_unit", "speculative_method"]
PARALLEL = ["{pipeline: 1000000000}", "{pipeline: 4096}", "{pipeline: 4097}",
            "{tensor: 1000000000}", "{tensor: 4096, pipeline: 4096}", "{pipeline: 2}",
            "{pipeline: 64}", "{decode_context: 1000000000}", "{pipeline: 3, tensor: 3}",
            "{pipeline: 2, pipeline_partition: [1000000000, 1]}",
            "{pipeline: 2, pipeline_partition: []}", "{pipeline: 2, num_hidden_layers: 1}",
            "{pipeline: 2, pipeline_partition: [1, 1, 1]}", "{pipeline: 0}", "{pipeline: -3}",
            "{pipeline: 8, num_hidden_layers: 2147483648}", "[]", "4", "{tensor: 7}"]


def _scalar_spans(text: str) -> list[tuple[int, int]]:
    """Where values stand: after ``key:`` or in flow collections, or as list items."""
    spans = [m.span(1) for m in re.finditer(r"(?<=[:\[,{-] )([^\s#,\[\]{}][^#,\[\]{}\n]*)", text)]
    return [s for s in spans if s[1] > s[0]]


def _replace_span(text: str, span: tuple[int, int], new: str) -> str:
    return text[:span[0]] + new + text[span[1]:]


def _pick_value(rng: random.Random, text: str) -> tuple[int, int] | None:
    spans = _scalar_spans(text)
    return rng.choice(spans) if spans else None


def _keys(text: str) -> list[tuple[int, int]]:
    return [m.span(1) for m in re.finditer(r"([A-Za-z_][A-Za-z0-9_]*)\s*:(?=\s)", text)]


# ---------------------------------------------------------------------------
# source mutations: each (rng, text) -> text; bytes-level ones take bytes
# ---------------------------------------------------------------------------


def m_flip_bits(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data or b" ")
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def m_insert_bytes(rng: random.Random, data: bytes) -> bytes:
    pool = b":{}[],&*!|>'\"#%@\t\n -?\\\x00\xff\xfe\xc3\xe2\x80"
    i = rng.randint(0, len(data))
    junk = bytes(rng.choice(pool) for _ in range(rng.randint(1, 6)))
    return data[:i] + junk + data[i:]


def m_delete_bytes(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    return data[:i] + data[i + rng.randint(1, 16):]


def m_truncate(rng: random.Random, data: bytes) -> bytes:
    return data[:rng.randint(0, len(data))]


def m_non_utf8(rng: random.Random, data: bytes) -> bytes:
    junk = rng.choice([b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\xf0\x28\x8c\x28", b"\x80",
                       b"\xef\xbb\xbf", b"\xff\xfe", b"\x00\x00", b"\xe2\x82"])
    i = rng.randint(0, len(data))
    return data[:i] + junk + data[i:]


def m_delete_line(rng: random.Random, text: str) -> str:
    lines = text.splitlines(keepends=True)
    if lines:
        i = rng.randrange(len(lines))
        del lines[i:i + rng.choice([1, 1, 1, 2, 5])]
    return "".join(lines)


def m_duplicate_line(rng: random.Random, text: str, big: bool = True) -> str:
    lines = text.splitlines(keepends=True)
    if not lines:
        return text
    i = rng.randrange(len(lines))
    line = lines[i] if lines[i].endswith("\n") else lines[i] + "\n"
    times = rng.choice([1, 1, 2, 10, 100] + ([5000, 50000] if big else []))
    times = max(1, min(times, MAX_INPUT // len(line) - len(text) // len(line) - 1))
    lines[i:i + 1] = [line] * (times + 1)
    return "".join(lines)


def m_swap_lines(rng: random.Random, text: str) -> str:
    lines = text.splitlines(keepends=True)
    if len(lines) > 1:
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    return "".join(lines)


def m_indent(rng: random.Random, text: str) -> str:
    lines = text.splitlines(keepends=True)
    if lines:
        i = rng.randrange(len(lines))
        if rng.random() < 0.5:
            lines[i] = rng.choice([" ", "  ", "\t", "    "]) + lines[i]
        else:
            lines[i] = lines[i].lstrip(" ")
    return "".join(lines)


def m_deep_nesting(rng: random.Random, text: str, big: bool = True) -> str:
    depth = rng.choice([10, 63, 64, 65, 100, 500] + ([1000, 3000, 20000] if big else []))
    span = _pick_value(rng, text)
    if rng.random() < 0.6:
        kind = rng.choice(["[]", "{}", "[{}]"])
        if kind == "[]":
            nest = "[" * depth + "1" + "]" * depth
        elif kind == "{}":
            nest = "{a: " * depth + "1" + "}" * depth
        else:
            nest = "[{a: " * (depth // 2) + "1" + "}]" * (depth // 2)
        return _replace_span(text, span, nest) if span else text + "\nx: " + nest + "\n"
    depth = min(depth, 900)   # block style grows as depth squared
    block = "".join("  " * d + f"k{d}:\n" for d in range(depth)) + "  " * depth + "v\n"
    if rng.random() < 0.3:
        block = "".join("  " * d + "-\n" for d in range(depth)) + "  " * depth + "v\n"
    return text + ("" if text.endswith("\n") or not text else "\n") + \
        rng.choice(["name", "engine", "extra", "layers", "defaults"]) + ":\n" + \
        "".join("  " + line + "\n" for line in block.splitlines())


def m_huge_number(rng: random.Random, text: str) -> str:
    nums = [m.span() for m in re.finditer(r"(?<![\w.])\d+(?![\w.])", text)]
    if not nums:
        return text
    return _replace_span(text, rng.choice(nums), rng.choice(HUGE))


def m_wrong_type(rng: random.Random, text: str) -> str:
    span = _pick_value(rng, text)
    return _replace_span(text, span, rng.choice(WRONG)) if span else text


def m_escape(rng: random.Random, text: str) -> str:
    esc = "".join(rng.choice(ESCAPES) for _ in range(rng.randint(1, 3)))
    span = _pick_value(rng, text)
    if span is None or rng.random() < 0.3:
        key = rng.choice(["model", "description", "name", "layer_name"])
        return re.sub(rf"(?m)^{key}:.*$", lambda _: f'{key}: "x{esc}"', text, count=1) \
            if re.search(rf"(?m)^{key}:", text) else text + f'\n{key}: "{esc}"\n'
    return _replace_span(text, span, f'"{text[span[0]:span[1]].strip(chr(34))}{esc}"')


def m_tag(rng: random.Random, text: str) -> str:
    span = _pick_value(rng, text)
    if span is None:
        return text
    value = text[span[0]:span[1]]
    if rng.random() < 0.3:
        value = rng.choice(["not-a-date", "2001-13-45", "[1]", "{a: b}", "x", "''", "1"])
    return _replace_span(text, span, f"{rng.choice(TAGS)} {value}")


def m_anchor(rng: random.Random, text: str) -> str:
    spans = _scalar_spans(text)
    if len(spans) < 2:
        return text
    a, b = sorted(rng.sample(spans, 2))
    name = rng.choice(["a", "x1", "anchor"])
    choice = rng.random()
    if choice < 0.2:    # an alias to an undefined anchor
        return _replace_span(text, b, f"*{name}undefined")
    if choice < 0.35:   # a merge key
        return text + f"\nbase: &{name} {{block_size: 16}}\nengine2:\n  <<: *{name}\n"
    if choice < 0.45:   # a small alias bomb
        lines = [f"a0: &a0 [{', '.join(['x'] * 9)}]"]
        lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
        return text + "\nbomb:\n" + "".join("  " + line + "\n" for line in lines)
    value = text[a[0]:a[1]]
    text = _replace_span(text, b, f"*{name}")
    return _replace_span(text, a, f"&{name} {value}")


def m_rename_key(rng: random.Random, text: str) -> str:
    keys = _keys(text)
    if not keys:
        return text
    span = rng.choice(keys)
    old = text[span[0]:span[1]]
    r = rng.random()
    if r < 0.3:
        new = rng.choice(KEYS)
    elif r < 0.5 and len(old) > 1:
        i = rng.randrange(len(old))
        new = old[:i] + old[i + 1:]
    elif r < 0.65:
        new = old.upper()
    elif r < 0.8:
        new = old + rng.choice(["s", "_", "x", "2"])
    else:
        new = rng.choice(["\"" + old + "\"", "'" + old + " '", "? " + old, old + " ",
                          "ñame", "1", "null", "true", "[a]"])
    return _replace_span(text, span, new)


def m_template(rng: random.Random, text: str) -> str:
    tpl = rng.choice(TEMPLATES)
    quoted = "'" + tpl.replace("'", "''") + "'"
    if re.search(r"(?m)^layer_name:", text) and rng.random() < 0.6:
        return re.sub(r"(?m)^layer_name:.*$", lambda _: f"layer_name: {quoted}", text, count=1)
    m = list(re.finditer(r"layer_name: *('[^'\n]*'|\"[^\"\n]*\"|[^,}\n]*)", text))
    if m and rng.random() < 0.7:
        return _replace_span(text, rng.choice(m).span(1), quoted)
    return re.sub(r"(?m)^(kvspec:.*)$", lambda g: g.group(1) + f"\nlayer_name: {quoted}",
                  text, count=1)


def m_parallel(rng: random.Random, text: str) -> str:
    value = rng.choice(PARALLEL)
    if re.search(r"(?m)^parallel:", text):
        # replace a flow mapping, or prepend a flow one before a block one
        new = re.sub(r"(?m)^parallel:[ \t]*\{[^}\n]*\}[ \t]*$", lambda _: f"parallel: {value}",
                     text, count=1)
        if new != text:
            return new
        return re.sub(r"(?m)^parallel:[ \t]*$", lambda _: f"parallel: {value}\nparallel_:",
                      text, count=1)
    return text + f"\nparallel: {value}\n"


def m_engine_value(rng: random.Random, text: str) -> str:
    key = rng.choice(["block_size", "max_model_len", "memory", "num_blocks", "layout",
                      "mamba_cache_mode", "mamba_block_size", "hybrid", "max_num_seqs",
                      "max_num_batched_tokens", "prefix_match_unit", "model_max_len",
                      "repeat", "num_kv_heads", "head_size", "sliding_window", "dtype",
                      "kind", "kv_cache_dtype", "index", "tokens_per_state", "shapes"])
    value = rng.choice(HUGE + WRONG + ["LHBNC", "BHLNC", "BLNHC", "lbnhc", "XYZAB", "auto",
                                       "all", "align", "fp8_ds_mla", "nvfp4", "uint8",
                                       "float8_e4m3fn", "'1/2'", "'1/0'", "'0/1'", "[[0]]",
                                       "[[" + str(10**12) + "]]", "[]", "mamba"])
    spans = [m.span(1) for m in re.finditer(rf"\b{key}: *([^,}}\n#]+)", text)]
    if spans:
        return _replace_span(text, rng.choice(spans), value)
    return text


def m_many_keys(rng: random.Random, text: str, big: bool = True) -> str:
    n = rng.choice([100, 1000] + ([50000, 70000] if big else []))
    where = rng.choice(["extra", "layer_types", "engine", "defaults"])
    if where == "layer_types":
        n = min(n, 30000)
    body = "".join(f"  k{i}: {i}\n" for i in range(n))
    if where == "layer_types":
        body = "".join(f"  t{i}: {{kind: full_attention}}\n" for i in range(n))
    return text + ("" if text.endswith("\n") or not text else "\n") + f"{where}:\n" + body


def m_many_layers(rng: random.Random, text: str, big: bool = True) -> str:
    n = rng.choice([10, 1000] + ([100000, 10**9, 2**31] if big else [2**31]))
    spans = [m.span(1) for m in re.finditer(r"\brepeat: *(\d+)", text)]
    if spans:
        return _replace_span(text, rng.choice(spans), str(n))
    return text


def m_splice(rng: random.Random, text: str, other: str = "") -> str:
    a = text.splitlines(keepends=True)
    b = other.splitlines(keepends=True)
    if not b:
        return text
    i, j = rng.randint(0, len(a)), rng.randrange(len(b))
    return "".join(a[:i] + b[j:j + rng.randint(1, 6)] + a[i:])


def m_control(rng: random.Random, text: str) -> str:
    span = _pick_value(rng, text)
    junk = rng.choice(["\x00", "\x07", "\x1b[31m", "\u2028", "\ufeff", "\t", "\r", "\x85",
                       "\ud800", "\U0001F600", "\u202e", "\x7f"])
    if span is None:
        return junk + text
    return text[:span[0]] + junk + text[span[0]:]


LAYER_FIELDS = ["num_kv_heads", "head_size", "head_size_v", "dtype", "kv_cache_dtype",
                "block_size", "sliding_window", "attention_chunk_size", "sink_len",
                "rswa_window", "tokens_per_state", "tokens_per_state", "state_content_bytes",
                "num_head_slots", "block_stride_alignment", "alignment", "page_size_padded",
                "model_version", "bounded_replay", "non_causal", "shapes", "dtypes",
                "mamba_type", "num_speculative_blocks", "num_prefill_checkpoint_blocks",
                "prefill_checkpoint_alignment", "tp_replicated", "layer_name", "kind"]
SECTION_FIELDS = {
    "engine": ["block_size", "max_model_len", "model_max_len", "max_num_batched_tokens",
               "max_num_seqs", "max_num_encoder_input_tokens", "async_scheduling", "layout",
               "hybrid", "prefix_caching", "prefix_match_unit", "memory", "num_blocks",
               "mamba_cache_mode", "mamba_block_size", "prefill_lookahead_tokens",
               "speculative_method", "draft"],
    "parallel": ["tensor", "pipeline", "decode_context", "pipeline_partition",
                 "num_hidden_layers"],
    "quantization": ["kv_cache_dtype", "skip_layers"],
}
FIELD_VALUES = ["0", "1", "2", "4", "16", "64", "576", "4096", "2147483648", "-1", "-2",
                "'0'", "'x'", "'1/0'", "'0/1'", "'1e3'", "'-2'", "'1/2'", "'4'", "'1/4096'",
                "'1/3'", "'inf'", "'nan'", "'3/2'", "1.5", "true", "null", "[]", "{}",
                "[[3, 4096]]", "[[0]]", "[[3, 4096], [8, 64, 64]]", "[bfloat16]", "[1, 2]",
                "[99]", "[-1]", "{pool: false}", "{block_size: 96}", "{pool_blocks: 0}",
                "fp8", "fp8_ds_mla", "nvfp4", "turboquant_k8v4", "eagle", "mtp", "mamba2",
                "uint8", "float8_e4m3fn", "int8", "auto", "LHBNC", "BHLNC", "all"]


def m_add_field(rng: random.Random, text: str) -> str:
    """A field, with a value of any type, put into a layer type or a section."""
    value = rng.choice(FIELD_VALUES)
    if rng.random() < 0.6:   # a layer: a flow mapping or a block one that has a kind
        flows = [m.end() for m in re.finditer(r"\{(?=[^{}\n]*\bkind:)", text)]
        blocks = list(re.finditer(r"(?m)^([ -]*)kind:.*$", text))
        field = rng.choice(LAYER_FIELDS)
        if flows and (not blocks or rng.random() < 0.7):
            at = rng.choice(flows)
            return text[:at] + f"{field}: {value}, " + text[at:]
        if blocks:
            m = rng.choice(blocks)
            indent = " " * len(m.group(1))
            return text[:m.end()] + f"\n{indent}{field}: {value}" + text[m.end():]
        return text
    section = rng.choice(sorted(SECTION_FIELDS))
    field = rng.choice(SECTION_FIELDS[section])
    flow = re.search(rf"(?m)^{section}:[ \t]*\{{", text)
    if flow:
        return text[:flow.end()] + f"{field}: {value}, " + text[flow.end():]
    block = re.search(rf"(?m)^{section}:[ \t]*$", text)
    if block:
        return text[:block.end()] + f"\n  {field}: {value}" + text[block.end():]
    return text + f"\n{section}: {{{field}: {value}}}\n"


TEXT_OPS = [m_add_field, m_add_field, m_add_field, m_delete_line, m_duplicate_line, m_swap_lines,
            m_indent, m_deep_nesting, m_huge_number, m_huge_number, m_wrong_type, m_wrong_type,
            m_escape, m_tag, m_anchor, m_rename_key, m_rename_key, m_template, m_parallel,
            m_engine_value, m_engine_value, m_many_keys, m_many_layers, m_splice, m_control]
BYTE_OPS = [m_flip_bits, m_insert_bytes, m_delete_bytes, m_truncate, m_non_utf8]
_BIG_OPS = {m_duplicate_line, m_deep_nesting, m_many_keys, m_many_layers}
#: The largest input a mutation makes: kvspec must answer any input up to 1 MB in
#: bounded time (issue 15); a mutation that would grow past it is undone.
MAX_INPUT = 1_000_000


def _enc(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def mutate_source(rng: random.Random, data: bytes, *, others: list[bytes] | None = None,
                  big: bool = True, rare_big: float = 0.15) -> tuple[bytes, list[str]]:
    """``data`` with one to three mutations; the names of the mutations applied.

    ``big`` allows inputs up to about 1 MB (tens of thousands of keys or lines,
    thousands of nesting levels); even then they are drawn only ``rare_big`` of
    the time, so a run spends its time on many small cases.
    """
    ops: list[str] = []
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
        before = data
        if rng.random() < 0.2:
            op = rng.choice(BYTE_OPS)
            data = op(rng, data)
        else:
            op = rng.choice(TEXT_OPS)
            text = data.decode("utf-8", "surrogateescape")
            if op is m_splice:
                other = rng.choice(others) if others else data
                text = m_splice(rng, text, other.decode("utf-8", "surrogateescape"))
            elif op in _BIG_OPS:
                text = op(rng, text, big=big and rng.random() < rare_big)  # type: ignore[call-arg]
            else:
                text = op(rng, text)
            data = text.encode("utf-8", "surrogateescape") if _encodable(text) else _enc(text)
        if len(data) > MAX_INPUT:   # the issue's bound: any input up to 1 MB
            data = before
            continue
        ops.append(op.__name__[2:])
    return data, ops


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8", "surrogateescape")
        return True
    except UnicodeEncodeError:
        return False


# ---------------------------------------------------------------------------
# dump mutations
# ---------------------------------------------------------------------------

#: Values a mutation puts in (copied each time: a list or object taken in is mutable).
_DUMP_VALUES: list[Any] = [
    "x", "", "two", "16", "8192", "1e3", "\ud800", "\U0001F600", None, True, False, 0, -1,
    1.5, float("nan"), float("inf"), 10**30, 2**63, 2**31, 10**9, [], {}, [1], {"x": 1},
    [[1, 2], [3]], "auto", "LHBNC", "BHLNC", "all", "align", "fp8_ds_mla", "nvfp4",
    "float8_e4m3fn", "uint8", "mamba", "mla", "full_attention", "{index.x}",
    "model.layers.{index}.attn", "model.layers.-1.attn", "model.layers.99999999999.attn"]
_CONFIG_KEYS = ["block_size", "max_model_len", "available_memory_bytes", "kv_cache_dtype",
                "enable_prefix_caching", "disable_hybrid_kv_cache_manager",
                "tensor_parallel_size", "pipeline_parallel_size",
                "decode_context_parallel_size", "num_gpu_blocks_override",
                "max_num_batched_tokens", "max_num_seqs", "mamba_cache_mode",
                "mamba_block_size", "kv_cache_layout", "original_max_model_len",
                "prefix_match_unit", "async_scheduling", "mamba_page_size_padded",
                "speculative_method", "pp_layer_partition"]
_LAYER_KEYS = ["name", "kind", "num_kv_heads", "head_size", "head_size_v", "dtype",
               "sliding_window", "attention_chunk_size", "shapes", "dtypes", "mamba_type",
               "cache_dtype_str", "state_content_bytes", "tokens_per_state", "block_size",
               "page_size_padded", "alignment", "sink_len", "num_speculative_blocks"]


def _paths(obj: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _get(obj: Any, path: tuple) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def _set(obj: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    _get(obj, path[:-1])[path[-1]] = value
    return obj


def _retyped(rng: random.Random, value: Any) -> Any:
    r = rng.random()
    if r < 0.25 and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value) if rng.random() < 0.7 else float(value)
    if r < 0.35:
        return [value] if rng.random() < 0.5 else {"value": value}
    return copy.deepcopy(rng.choice(_DUMP_VALUES))


def tree_edit(rng: random.Random, obj: Any, path: tuple, op: str, keys: list[str],
              values: list[Any]) -> tuple[Any, str] | None:
    """The edits of any JSON tree at ``path``: ``retype``, ``drop``, ``add`` (a key
    of ``keys`` or an odd one, a value of ``values``), ``nest`` and ``rename`` (to a
    key of ``keys`` or a near miss); None when ``op`` is another or does not apply."""
    parent = _get(obj, path[:-1]) if path else None
    if op == "retype":
        return _set(obj, path, _retyped(rng, _get(obj, path))), op
    if op == "drop" and path:
        del parent[path[-1]]
        return obj, op
    if op == "add" and isinstance(_get(obj, path), dict):
        _get(obj, path)[rng.choice(keys + ["extra", ""])] = copy.deepcopy(rng.choice(values))
        return obj, op
    if op == "nest":
        value = _get(obj, path)
        for _ in range(rng.choice([1, 2, 5, 70])):
            value = [value] if rng.random() < 0.5 else {"x": value}
        return _set(obj, path, value), op
    if op == "rename" and path and isinstance(parent, dict):
        new = rng.choice(keys + [path[-1] + "s", path[-1].upper(), ""])
        parent[new] = parent.pop(path[-1])
        return obj, op
    return None


def _dump_op(rng: random.Random, obj: Any) -> tuple[Any, str]:
    paths = list(_paths(obj))
    path = rng.choice(paths)
    op = rng.choice(["retype", "retype", "drop", "add", "nest", "rename", "config", "config",
                     "layer", "layer", "dup_layers", "top"])
    edited = tree_edit(rng, obj, path, op, _CONFIG_KEYS + _LAYER_KEYS, _DUMP_VALUES)
    if edited is not None:
        return edited
    if op == "config" and isinstance(obj, dict) and isinstance(obj.get("config"), dict):
        obj["config"][rng.choice(_CONFIG_KEYS)] = copy.deepcopy(rng.choice(_DUMP_VALUES))
        return obj, op
    if op == "layer" and isinstance(obj, dict) and isinstance(obj.get("layers"), list) \
            and obj["layers"]:
        i = rng.randrange(len(obj["layers"]))
        if isinstance(obj["layers"][i], dict) and rng.random() < 0.8:
            obj["layers"][i][rng.choice(_LAYER_KEYS)] = copy.deepcopy(rng.choice(_DUMP_VALUES))
        else:
            obj["layers"][i] = rng.choice([5, "x", None, [], [1, 2], True])
        return obj, op
    if op == "dup_layers" and isinstance(obj, dict) and isinstance(obj.get("layers"), list) \
            and obj["layers"]:
        layers = obj["layers"]
        r = rng.random()
        if r < 0.4:
            layers.append(rng.choice(layers))
        elif r < 0.6:
            obj["layers"] = layers * rng.choice([2, 50])
        elif r < 0.8:
            rng.shuffle(layers)
        else:
            obj["layers"] = []
        return obj, op
    if op == "top":
        if isinstance(obj, dict) and rng.random() < 0.7:
            obj[rng.choice(["config", "layers", "name", "model", "facts"])] = \
                rng.choice(["x", 5, None, [], {}, [1, 2], {"a": 1}])
            return obj, op
        return rng.choice([[], 5, "str", None, [obj], {"dump": obj}]), op
    return _set(obj, path, _retyped(rng, _get(obj, path))), "retype"


def _dump_text_op(rng: random.Random, text: str, big: bool) -> tuple[str, str]:
    r = rng.random()
    if r < 0.2:
        depth = rng.choice([100, 500] + ([2000, 100000] if big else [1500]))
        spans = [m.span(1) for m in re.finditer(r":\s*(-?\d+|\"[^\"\n]*\"|true|false|null)",
                                                text)]
        if spans:
            return _replace_span(text, rng.choice(spans),
                                 "[" * depth + "1" + "]" * depth), "deep_nesting"
    if r < 0.35:
        spans = [m.span(1) for m in re.finditer(r":\s*(-?\d+)", text)]
        if spans:
            return _replace_span(text, rng.choice(spans), rng.choice(
                ["NaN", "Infinity", "-Infinity", "1e999", "-0", "1.0", "0x10", "01",
                 "9" * 5000, "1E400", "true"])), "json_literal"
    if r < 0.5:
        m = list(re.finditer(r"\"(\w+)\": ([^,\n{}\[\]]+)", text))
        if m:
            g = rng.choice(m)
            value = rng.choice(['"x"', "0", "null", "[]"])
            dup = f'"{g.group(1)}": {value}, '
            return text[:g.start()] + dup + text[g.start():], "duplicate_key"
    if r < 0.65:
        return m_truncate(rng, text.encode()).decode("utf-8", "replace"), "truncate"
    if r < 0.75:
        return "\ufeff" + text, "bom"
    lines = text.splitlines(keepends=True)
    if lines:
        i = rng.randrange(len(lines))
        del lines[i]
    return "".join(lines), "delete_line"


def _mutate_json(rng: random.Random, data: bytes, op: Any, *, indents: list[Any],
                 text_p: float, flip_p: float, big: bool) -> tuple[bytes, list[str]]:
    """JSON with one to four edits by ``op``, written with one of ``indents``;
    then an edit of its text (``text_p``) and flipped bits (``flip_p``) sometimes."""
    obj: Any = json.loads(data)
    ops = []
    for _ in range(rng.choice([1, 1, 2, 3, 4])):
        obj, name = op(rng, obj)
        ops.append(name)
    text = json.dumps(obj, indent=rng.choice(indents))
    if rng.random() < text_p:
        text, name = _dump_text_op(rng, text, big and rng.random() < 0.3)
        ops.append(name)
    if flip_p and rng.random() < flip_p:
        return m_flip_bits(rng, text.encode("utf-8", "surrogatepass")), ops + ["flip_bits"]
    return text.encode("utf-8", "surrogatepass"), ops


def mutate_dump(rng: random.Random, data: bytes, *, big: bool = True
                ) -> tuple[bytes, list[str]]:
    """A dump with one to four structural edits, and sometimes an edit of its text."""
    return _mutate_json(rng, data, _dump_op, indents=[1, 1, 2, None], text_p=0.3,
                        flip_p=0.05, big=big)


# ---------------------------------------------------------------------------
# config.json mutations (kvspec init --from-hf)
# ---------------------------------------------------------------------------

#: Fields the families read (kvspec/integrations/hf/families).
HF_KEYS = ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
           "hidden_size", "max_position_embeddings", "torch_dtype", "dtype", "sliding_window",
           "layer_types", "model_type", "architectures", "text_config", "kv_lora_rank",
           "qk_rope_head_dim", "use_sliding_window", "max_window_layers",
           "sliding_window_pattern", "attention_chunk_size", "no_rope_layers",
           "hybrid_override_pattern", "linear_num_key_heads", "linear_key_head_dim",
           "linear_value_head_dim", "linear_num_value_heads", "linear_conv_kernel_dim",
           "full_attention_interval", "mamba_num_heads", "mamba_head_dim", "ssm_state_size",
           "n_groups", "conv_kernel", "attn_layer_period", "attn_layer_offset",
           "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_ssm_cache_dtype",
           "mamba_ssm_dtype", "num_nextn_predict_layers", "mtp_num_hidden_layers",
           "_name_or_path", "attention_head_dim"]
_HF_VALUES: list[Any] = _DUMP_VALUES + [
    64, 128, 3, 7, 48, 1000000, 2**31 + 1, "bfloat16", "float16", "float32", "torch.float8_e4m3fn",
    "fp8", "int8", ["full_attention", "sliding_attention"], [0, 1], ["Foo"],
    "LlamaForCausalLM", "M*-E", "MMX", "gemma3", "llama4"]
#: ``kvspec init`` flags, picked by the config's bytes (so a saved input reproduces).
_INIT_FLAGS = [[], [], [], [], [], [], ["--tp", "2"], ["--tp", "4"], ["--tp", "8"],
               ["--kv-cache-dtype", "fp8"], ["--no-prefix-caching"], ["--target", "turing"]]


def init_args(file: str, data: bytes) -> list[str]:
    """The ``kvspec init`` command line a mutated config is fuzzed with."""
    import zlib
    return ["init", "--from-hf", file, *_INIT_FLAGS[zlib.crc32(data) % len(_INIT_FLAGS)]]


def _config_op(rng: random.Random, obj: Any) -> tuple[Any, str]:
    """Set, drop or retype a field a family reads (or the text config's), or a
    structural edit of the dump mutator."""
    if rng.random() < 0.35 or not isinstance(obj, dict):
        return _dump_op(rng, obj)
    target = obj
    if isinstance(obj.get("text_config"), dict) and rng.random() < 0.5:
        target = obj["text_config"]
    key = rng.choice(HF_KEYS + list(target))
    if key in target and rng.random() < 0.25:
        del target[key]
        return obj, f"drop:{key}"
    value = target.get(key)
    if isinstance(value, list) and value and rng.random() < 0.5:
        value = list(value)
        value[rng.randrange(len(value))] = copy.deepcopy(rng.choice(_HF_VALUES))
        target[key] = value
        return obj, f"entry:{key}"
    target[key] = (_retyped(rng, value) if rng.random() < 0.3
                   else copy.deepcopy(rng.choice(_HF_VALUES)))
    return obj, f"set:{key}"


def mutate_config(rng: random.Random, data: bytes, *, big: bool = True
                  ) -> tuple[bytes, list[str]]:
    """A config.json with one to four edits of the fields the families read."""
    return _mutate_json(rng, data, _config_op, indents=[2, 2, 1, None], text_p=0.15,
                        flip_p=0, big=big)


def check_init(file: str, data: bytes, *, seconds: float = 10.0) -> Outcome:
    """``kvspec init --from-hf FILE`` on a config (already written at ``file``),
    judged as :func:`check_cli` judges; a source it writes must compile."""
    from kvspec.compiler import compile_source
    from kvspec.errors import KvspecError

    out = check_cli(init_args(file, data), file, data, seconds=seconds, kind="json")
    if out.exit_code != 0 or out.status == "defect":
        return out
    try:
        with time_limit(seconds):
            compile_source(out.stdout, "init.yaml")
    except KvspecError as err:
        out.add("init: the source written does not compile", err.message[:200],
                re.sub(r"'[^']*'|\d[\d,]*", "_", err.message)[:80])
    except (Exception, CaseTimeout) as exc:  # noqa: BLE001
        category, sig = _crash_signature(exc)
        out.add(category, f"compiling init's source: {type(exc).__name__}: {exc}"[:200], sig)
    return out


# ---------------------------------------------------------------------------
# command lines: every command, its options with hostile values
# ---------------------------------------------------------------------------

#: The files a command line may name, in its working directory, and where they come from.
CLI_FILES = {"a.yaml": "layouts/llama-3.1-8b.yaml",
             "a.kvlayout.json": "layouts/llama-3.1-8b.kvlayout.json",
             "b.yaml": "layouts/deepseek-v3.yaml", "config.json": "tests/data/hf/qwen3-8b.json",
             "dump.json": "tests/conformance/cases/synthetic-uniform.json"}
#: Hostile files beside them, by content: JSON nested deeper than ``json`` recurses
#: and a number longer than Python reads, as artifacts, as a dump, as a source that
#: looks like JSON, and as the committed artifact of a real source (for ``check``).
CLI_HOSTILE = {"deep.kvlayout.json": b"[" * 5000 + b"]" * 5000,
               "long.kvlayout.json": b'{"format": "kvspec.layout/2", "body": 1'
                                     + b"0" * 5000 + b"}",
               "deep.json": b'{"config": ' * 5000 + b"1" + b"}" * 5000,
               "deep.yaml": b'{"a": ' * 5000 + b"1" + b"}" * 5000,
               "c.yaml": (ROOT / "layouts/llama-3.1-8b.yaml").read_bytes(),
               "c.kvlayout.json": b'{"x": ' * 5000 + b"1" + b"}" * 5000}
CLI_VALUES = ["0", "-1", "1", "16", "40GiB", "1..2", "40GiB..80GiB", "80GiB..40GiB",
              "1B..1TiB", "0..0", "40GiB..", "..40GiB", "x", "", "1e9", "9" * 30, "auto",
              "json", "text", "html", "md", "nonexist", "/", ".", "..", "-", "--", "LBNHC",
              "fp8", "hopper", "vllm", "é", "2**40", "[a]", "a b", "nan", "inf", "1,5", "0.5",
              "\x01", "\u202e", *CLI_FILES, *CLI_HOSTILE]
#: Commands the fuzzer leaves out: they need vLLM (their own suite covers them).
_CLI_SKIP = {"--from-vllm", "--against"}


def cli_commands() -> dict[str, Any]:
    """Every ``kvspec`` command's click object, by name."""
    import importlib

    from kvspec.cli import COMMANDS
    return {m.rstrip("_").replace("_", "-"): importlib.import_module(f"kvspec.cli.{m}").command
            for m in COMMANDS}


def cli_args(rng: random.Random) -> list[str]:
    """A ``kvspec`` command line: a command, some of its options with values
    drawn from :data:`CLI_VALUES`, and arguments (files that exist or not)."""
    import click

    commands = cli_commands()
    name = rng.choice(sorted(commands))
    params = [p for p in commands[name].params if p.name != "help"
              and not set(getattr(p, "opts", ())) & _CLI_SKIP]
    args = [name]
    options = [p for p in params if isinstance(p, click.Option)]
    for p in rng.sample(options, k=min(len(options), rng.choice([0, 1, 2, 3]))):
        args += [p.opts[0]] if p.is_flag else [p.opts[0], rng.choice(CLI_VALUES)]
    for p in params:
        if isinstance(p, click.Argument) and (p.required or rng.random() < 0.7):
            pool = list(CLI_FILES) * 3 + list(CLI_HOSTILE) + CLI_VALUES
            args += [rng.choice(pool) for _ in range(1 if p.nargs == 1 else rng.choice([1, 2]))]
    return args


def _usage_messages(out: Outcome, stderr: str) -> None:
    """Every error message of a refused command line has a hint (click's own
    usage errors end in its "Try 'kvspec ... -h' for help."; other lines, such as
    ``validate``'s "1 of 2 sources have problems", are no messages)."""
    if "Usage:" in stderr and "Error:" in stderr:
        return
    for lines in split_messages(stderr):
        if ": error: " not in lines[0]:
            continue
        out.messages += 1
        if not any(line.startswith("  hint:") for line in lines):
            out.messages_without_hint += 1
            template = re.sub(r"'[^']*'|\d[\d,]*", "_", lines[0].split(": error: ")[-1])[:70]
            out.add("message quality: no hint", lines[0][:200], template)


def check_args(args: list[str], workdir: str, *, seconds: float = 10.0) -> Outcome:
    """Run ``kvspec ARGS`` in-process in ``workdir`` (holding :data:`CLI_FILES` and
    :data:`CLI_HOSTILE`, restored before the run): exit 0, 1 or 2, no traceback, every message with
    a hint. (``diff`` exits 1 with nothing on stderr when the plans differ.)"""
    for name, rel in CLI_FILES.items():
        (Path(workdir) / name).write_bytes((ROOT / rel).read_bytes())
    for name, data in CLI_HOSTILE.items():
        (Path(workdir) / name).write_bytes(data)
    return run_cli(args, _usage_messages, seconds=seconds, cwd=workdir)


# ---------------------------------------------------------------------------
# valid sources
# ---------------------------------------------------------------------------

AXIS_ORDERS = ("LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
QUANT_MODES = ("auto", "fp8", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head",
               "int4_per_token_head", "nvfp4", "fp8_ds_mla", "nvfp4_ds_mla",
               "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
               "turboquant_3bit_nc")
FAMILIES = ("attention", "hybrid", "aliasing", "eagle")
MAMBA_SHAPES = {
    "mamba1": ([[3, 4096], [4096, 16]], ["bfloat16", "bfloat16"]),
    "mamba2": ([[3, 2048], [16, 64, 64]], ["bfloat16", "float32"]),
    "gdn_attention": ([[3, 4096], [8, 64, 64]], ["bfloat16", "float32"]),
    "short_conv": ([[3, 1024]], ["bfloat16"]),
    "linear_attention": ([[8, 64, 64]], ["float32"]),
}


def _heads(rng: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {"num_kv_heads": rng.choice([1, 2, 4, 8, 16]),
                           "head_size": rng.choice([64, 80, 96, 128, 256])}
    if rng.random() < 0.1:
        out["head_size_v"] = rng.choice([64, 128])
    return out


def _attention_type(rng: random.Random, kind: str) -> dict[str, Any]:
    t: dict[str, Any] = {"kind": kind}
    if kind in ("mla", "sliding_window_mla"):
        t.update(num_kv_heads=1, head_size=rng.choice([576, 576, 512, 192]))
    elif kind == "hidden_state":
        t.update(num_kv_heads=1, head_size=rng.choice([2048, 4096]))
    else:
        t.update(_heads(rng))
    if kind in ("sliding_window", "sliding_window_mla", "kpool_tail"):
        t["sliding_window"] = rng.choice([16, 128, 1024, 4096])
    if kind == "chunked_local":
        t["attention_chunk_size"] = rng.choice([256, 1024, 8192])
    if kind == "sink_full_attention":
        t["sink_len"] = rng.choice([0, 4, 16])
    if kind == "rswa":
        t["rswa_window"] = rng.choice([64, 512])
    if kind in ("circular_buffer", "kpool_tail"):
        t["block_size"] = rng.choice([16, 64])
    if rng.random() < 0.1:
        t["dtype"] = rng.choice(["bfloat16", "float16", "float32"])
    if rng.random() < 0.1:
        t["kv_cache_dtype"] = rng.choice(QUANT_MODES)
    if rng.random() < 0.05 and kind not in ("circular_buffer", "kpool_tail"):
        t["tokens_per_state"] = rng.choice([2, 4, "1/2"])
    return t


_ATTN_KINDS = ("full_attention", "full_attention", "sliding_window", "sliding_window",
               "chunked_local", "mla", "sliding_window_mla", "cross_attention",
               "encoder_only", "sink_full_attention", "rswa", "circular_buffer", "kpool_tail")


def _family_types(rng: random.Random, family: str) -> tuple[dict, list[str], dict, list]:
    """Layer types, a pattern, engine settings the family needs, and layer
    entries after the pattern."""
    types: dict[str, Any] = {}
    engine: dict[str, Any] = {}
    after: list[Any] = []
    if family == "aliasing":   # GLM-5-Next-style: state layers alias MLA/indexer slots
        mtype = rng.choice(["gdn_attention", "mamba2", "gdn_attention"])
        shapes, dtypes = MAMBA_SHAPES[mtype]
        types["gdn"] = {"kind": "mamba", "shapes": shapes, "dtypes": dtypes,
                        "mamba_type": mtype, "layer_name": "model.layers.{index}.linear_attn"}
        types["mla"] = {"kind": "mla", "num_kv_heads": 1, "head_size": 576, "dtype": "uint8",
                        "state_content_bytes": 656, "kv_cache_dtype": "fp8_ds_mla"}
        types["indexer"] = {"kind": "mla", "num_kv_heads": 1, "head_size": 128,
                            "dtype": "uint8", "state_content_bytes": 132,
                            "tokens_per_state": 4, "kv_cache_dtype": "fp8_ds_mla",
                            "layer_name": "model.layers.{index}.self_attn.indexer.k_cache"}
        types["tail"] = {"kind": "kpool_tail", "num_kv_heads": 1, "head_size": 132,
                         "dtype": "uint8", "state_content_bytes": 132, "block_size": 64,
                         "sliding_window": 64,
                         "layer_name": "model.layers.{index}.self_attn.indexer.kpool_tail"}
        n_state = rng.choice([1, 2, 3, 3, 4])
        cache = rng.choice(["mla+indexer+tail", "mla+indexer+tail", "mla+indexer", "mla"])
        pattern = ["gdn"] * n_state + [cache]
        if rng.random() < 0.2:
            rng.shuffle(pattern)
        engine["block_size"] = rng.choice([256, 512, 512, 1024])
        engine["mamba_cache_mode"] = rng.choice(["align", "align", "none", "all"])
        engine["mamba_block_size"] = engine["block_size"]
        if rng.random() < 0.7:
            types["sliding"] = {"kind": rng.choice(["sliding_window", "sliding_window",
                                                    "full_attention"]),
                                "num_kv_heads": rng.choice([1, 4, 8]), "head_size": 128,
                                "dtype": "bfloat16", "sliding_window": 2048}
            if types["sliding"]["kind"] == "full_attention":
                del types["sliding"]["sliding_window"]
            engine["draft"] = {"pool": rng.random() < 0.7}
            if rng.random() < 0.4:
                engine["draft"]["block_size"] = rng.choice([64, 128, 256, 512])
            if rng.random() < 0.3:
                engine["draft"]["pool_blocks"] = rng.choice([1, 8, 64, 1000])
            after.append({"pattern": ["sliding"]})
        return types, pattern, engine, after
    kinds = rng.sample(_ATTN_KINDS, rng.choice([1, 1, 2, 2, 3]))
    for i, kind in enumerate(kinds):
        types[f"t{i}"] = _attention_type(rng, kind)
    pattern = [rng.choice(list(types)) for _ in range(rng.randint(1, 5))]
    if family == "hybrid":
        mtype = rng.choice(sorted(MAMBA_SHAPES))
        shapes, dtypes = MAMBA_SHAPES[mtype]
        types["m"] = {"kind": "mamba", "shapes": shapes, "dtypes": dtypes, "mamba_type": mtype,
                      "layer_name": "model.layers.{index}.mixer"}
        if rng.random() < 0.2:
            types["m"]["num_speculative_blocks"] = rng.choice([0, 1, 2])
        pattern = ["m"] * rng.randint(1, 4) + pattern
        rng.shuffle(pattern)
        engine["mamba_cache_mode"] = rng.choice(["none", "align", "all"])
        engine["mamba_block_size"] = rng.choice([256, 512, 1024])
        engine["block_size"] = rng.choice([16, 64, 80, 256, 528, 1024])
    if family == "eagle":
        engine["speculative_method"] = rng.choice(["eagle", "eagle3", "mtp", "dflash", "ngram"])
        last = rng.choice(list(types))
        if types[last]["kind"] not in ("mla", "sliding_window_mla", "hidden_state") \
                and rng.random() < 0.6:
            types["draft"] = dict(types[last], non_causal=True)
            pattern.append("draft")
    if rng.random() < 0.15:
        pattern.insert(rng.randrange(len(pattern) + 1), "-")
    return types, pattern, engine, after


def valid_source(rng: random.Random, *, layout: str | None = None,
                 family: str | None = None) -> tuple[str, dict[str, str]]:
    """A source meant to compile (YAML text, one key per line), and what it is:
    ``{"layout": ..., "family": ...}``."""
    family = family or rng.choice(FAMILIES)
    layout = layout or rng.choice(AXIS_ORDERS)
    types, pattern, fam_engine, after = _family_types(rng, family)
    engine: dict[str, Any] = {
        "block_size": rng.choice([16, 16, 32, 64, 128]),
        "max_model_len": rng.choice([128, 1024, 4096, 8192, 32768, "auto"]),
        "max_num_batched_tokens": rng.choice([512, 2048, 8192]),
        "max_num_seqs": rng.choice([8, 64, 256]),
        "layout": layout,
        "hybrid": rng.random() < (0.92 if family in ("hybrid", "aliasing") else 0.75),
        "prefix_caching": rng.random() < 0.8,
        "mamba_cache_mode": rng.choice(["none", "align", "all"]),
    }
    engine.update(fam_engine)
    if engine["max_model_len"] == "auto":
        engine["model_max_len"] = rng.choice([8192, 32768, 131072])
    budget = rng.choice(["none", "memory", "memory", "blocks"])
    if budget == "memory" or (engine["max_model_len"] == "auto" and budget == "none"):
        engine["memory"] = rng.choice(["64MiB", "512MiB", "2GiB", "16GiB", "40GiB"])
    elif budget == "blocks":
        engine["num_blocks"] = rng.choice([1, 17, 100, 1000, 5000])
    if rng.random() < 0.2:
        engine["async_scheduling"] = rng.random() < 0.5
    if rng.random() < 0.15:
        engine["prefix_match_unit"] = rng.choice([8, 16, 32, 64])
    if rng.random() < 0.1:
        engine["prefill_lookahead_tokens"] = rng.choice([1, 4])
    repeat = rng.randint(1, 8)
    n_layers = repeat * len(pattern) + sum(len(a["pattern"]) for a in after)
    pp = rng.choice([1, 1, 1, 2, 2, 3, 4])
    par: dict[str, Any] = {"tensor": rng.choice([1, 1, 2, 4, 8]), "pipeline": pp,
                           "decode_context": rng.choice([1] * 8 + [2, 4])}
    if pp > 1 and rng.random() < 0.2 and n_layers >= pp:
        cuts = sorted(rng.sample(range(1, n_layers), pp - 1))
        par["pipeline_partition"] = [b - a for a, b in zip([0] + cuts, cuts + [n_layers])]
    latent = {t["kind"] for t in types.values()} & {"mla", "sliding_window_mla"}
    fitting = ("auto", "fp8", "fp8_ds_mla", "nvfp4_ds_mla") if latent else \
        tuple(q for q in QUANT_MODES if "_ds_mla" not in q)
    if family == "aliasing":   # its MLA types set their own mode; the drafter is not MLA
        fitting = ("auto", "fp8")
    modes = QUANT_MODES if rng.random() < 0.15 else fitting
    quant: dict[str, Any] = {"kv_cache_dtype": rng.choice(("auto",) * 3 + modes)}
    if rng.random() < 0.2:
        quant["skip_layers"] = sorted(rng.sample(range(n_layers), min(n_layers,
                                                                       rng.randint(1, 2))))
    layers: list[Any] = [{"repeat": repeat, "pattern": pattern}, *after]
    if rng.random() < (0.1 if pp == 1 else 0.01):
        hs = {"kind": "hidden_state", "num_kv_heads": 1, "head_size": 4096}
        layers.append(dict(hs, name="model.hidden_states.cache"))
    doc = {"kvspec": 1, "name": f"fuzz-{family}-{layout.lower()}",
           "layer_name": "model.layers.{index}.self_attn.attn", "engine": engine,
           "parallel": par,
           "defaults": {"num_kv_heads": 8, "head_size": 128,
                        "dtype": rng.choice(["bfloat16", "bfloat16", "float16", "float32"])},
           "quantization": quant, "layer_types": types, "layers": layers}
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=1000)
    return text, {"layout": layout, "family": family}


# ---------------------------------------------------------------------------
# the oracle
# ---------------------------------------------------------------------------


class CaseTimeout(BaseException):
    """A case ran past its time limit (a BaseException: no ``except Exception``
    in kvspec swallows it)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`CaseTimeout` after ``seconds`` (main thread, POSIX)."""
    if seconds <= 0 or not hasattr(signal, "setitimer"):
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"over {seconds:g} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclass
class Outcome:
    """What kvspec did with one input."""

    #: ``ok`` (accepted / compiled), ``clean`` (refused with good messages),
    #: ``defect``
    status: str
    #: defect categories (empty unless ``status == "defect"``)
    defects: list[str] = field(default_factory=list)
    #: a short line per defect, for the report
    details: list[str] = field(default_factory=list)
    #: one key per defect class, to keep one reproducer per class
    signatures: list[str] = field(default_factory=list)
    messages: int = 0
    messages_without_position: int = 0
    messages_without_hint: int = 0
    exit_code: int | None = None
    stdout: str = field(default="", repr=False)

    def add(self, category: str, detail: str, signature: str) -> None:
        self.status = "defect"
        self.defects.append(category)
        self.details.append(detail)
        self.signatures.append(f"{category} | {signature}")


def _crash_signature(exc: BaseException) -> tuple[str, str]:
    """(category, signature) of an exception that escaped kvspec."""
    tb = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in tb if "/kvspec/" in f.filename and "/tests/" not in f.filename]
    yaml_frames = [f for f in tb if "/yaml/" in f.filename]
    frame = (ours or yaml_frames or tb or [None])[-1]
    where = f"{Path(frame.filename).name}:{frame.name}" if frame else "?"
    name = type(exc).__name__
    if isinstance(exc, CaseTimeout):
        return "timeout", f"timeout at {where}"
    if isinstance(exc, RecursionError):
        return "RecursionError", where
    if isinstance(exc, MemoryError):
        return "MemoryError", where
    return "traceback", f"{name} at {where}"


_PATH_TOKEN = re.compile(r"\[(-?\d+)\]|([^.\[\]]+)")


class Positions:
    """Whether the problems of an input have a position (computed on demand)."""

    def __init__(self, data: bytes, kind: str = "yaml") -> None:
        self.data = data
        self.kind = kind
        self._root: Any = None
        self._syntax: bool | None = None

    def _compose(self) -> None:
        if self._syntax is not None:
            return
        self._syntax = False
        try:
            text = self.data.decode("utf-8")
        except UnicodeDecodeError:
            self._syntax = True   # the offending byte has a line and column
            return
        if self.kind == "json":
            try:
                json.loads(text)
            except json.JSONDecodeError:
                self._syntax = True
                return
            except (RecursionError, ValueError):
                self._syntax = True   # nested too deep, a number too long: it has a place
                return
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        try:
            self._root = yaml.compose(text, Loader=loader)
        except yaml.MarkedYAMLError as exc:
            # JSON that YAML does not read (e.g. a tab) still has positions by path
            self._syntax = self.kind == "yaml" and (exc.problem_mark is not None
                                                    or exc.context_mark is not None)
        except RecursionError:
            self._syntax = self.kind == "yaml"   # nested too deep: the nesting has a place
        except Exception:  # noqa: BLE001  (a reader error without a mark)
            self._syntax = False

    @property
    def syntax_error(self) -> bool:
        """The input is not UTF-8, or not YAML, at a known place."""
        self._compose()
        return bool(self._syntax)

    def trouble(self) -> str | None:
        """What in the input may hide positions: a key given twice, deep nesting."""
        self._compose()
        stack = [(self._root, 1)] if self._root is not None else []
        deepest, seen = 0, set()
        while stack:
            node, depth = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            deepest = max(deepest, depth)
            if isinstance(node, yaml.MappingNode):
                keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
                if len(keys) != len(set(keys)):
                    return "the input has a key twice in one mapping"
                stack += [(v, depth + 1) for _, v in node.value]
            elif isinstance(node, yaml.SequenceNode):
                stack += [(v, depth + 1) for v in node.value]
        return "the input nests more than 64 levels" if deepest > 64 else None

    def node(self, path: str) -> Any:
        """The YAML node at an error's ``at:`` path, or None."""
        self._compose()
        node = self._root
        if node is None or not path:
            return None
        for index, key in _PATH_TOKEN.findall(path):
            token = index or key
            if isinstance(node, yaml.SequenceNode):
                if not token.lstrip("-").isdigit() or not -len(node.value) <= int(token) \
                        < len(node.value):
                    return None
                node = node.value[int(token)]
            elif isinstance(node, yaml.MappingNode):
                node = _lookup(node, token)
                if node is None:
                    return None
            else:
                return None
        return node


def _lookup(node: yaml.MappingNode, key: str, depth: int = 0) -> Any:
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return v
    for k, v in node.value:   # merge keys
        if depth < 8 and isinstance(k, yaml.ScalarNode) and k.value == "<<":
            for m in (v.value if isinstance(v, yaml.SequenceNode) else [v]):
                if isinstance(m, yaml.MappingNode):
                    found = _lookup(m, key, depth + 1)
                    if found is not None:
                        return found
    return None


#: Characters a message should never print as they are (terminal escapes, C1
#: controls, line separators, bidirectional overrides): the input's, echoed back.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e"
                      "\u2066-\u2069\ud800-\udfff]")


def split_messages(stderr: str) -> list[list[str]]:
    """Messages of a command's stderr: a line at column 0 and the indented ones after."""
    messages: list[list[str]] = []
    for line in stderr.split("\n"):   # not splitlines: \x85 and \u2028 are in messages
        if line.startswith("  ") and messages:
            messages[-1].append(line)
        elif line.strip():
            messages.append([line])
    return messages


def judge_messages(out: Outcome, stderr: str, file: str, positions: Positions) -> None:
    """Add a defect to ``out`` for every message below the bar."""
    head = re.compile(re.escape(file) + r"(:(\d+):(\d+))?: error: \S")
    messages = split_messages(stderr)
    if not messages:
        out.add("message quality: no message", "refused with nothing on stderr", "empty")
    for lines in messages:
        out.messages += 1
        m = head.match(lines[0])
        if not m:
            out.add("message quality: format", lines[0][:200],
                    re.sub(r"\d+", "N", lines[0].split(": error:")[-1][:60]))
            continue
        text = lines[0][m.end() - 1:]
        template = re.sub(r"'[^']*'|\d[\d,]*", "_", text)[:70]
        template = re.sub(r"^(not valid JSON|invalid YAML|cannot read)\b.*", r"\1 ...", template)
        if m.group(1) is None:
            at = next((line[6:] for line in lines if line.startswith("  at: ")), None)
            has_node = at is not None and positions.node(at) is not None
            if has_node or positions.syntax_error:
                out.messages_without_position += 1
                why = f"at: {at} is in the input" if has_node else "a syntax/encoding error"
                out.add("message quality: no line:col", f"{lines[0][:160]} ({why})",
                        positions.trouble() or template)
        raw = next((c for line in lines for c in line if _CONTROL.match(c)), None)
        if raw is not None:
            out.add("message quality: raw control character",
                    f"{raw!a} printed as is: {lines[0][:150]!a}", ascii(raw))
        if not any(line.startswith("  hint:") for line in lines):
            out.messages_without_hint += 1
            out.add("message quality: no hint", lines[0][:200], template)


def run_cli(args: list[str], judge: Any, *, seconds: float = 10.0,
            cwd: str | None = None) -> Outcome:
    """Run ``kvspec ARGS`` in-process (in ``cwd``): anything escaping, a printed
    traceback or an exit code other than 0, 1 and 2 is a defect; a refusal's
    stderr goes to ``judge(outcome, stderr)``."""
    import os

    from tests.conftest import invoke

    out, here = Outcome("ok"), os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with time_limit(seconds):
            code, stdout, stderr = invoke(args)
    except (Exception, CaseTimeout) as exc:  # noqa: BLE001  anything escaping is a defect
        category, sig = _crash_signature(exc)
        out.add(category, f"{type(exc).__name__}: {str(exc)[:160]}", sig)
        return out
    finally:
        os.chdir(here)
    out.exit_code, out.stdout = code, stdout
    if "Traceback" in stdout or "Traceback" in stderr:
        out.add("traceback", "'Traceback' in the output", "printed traceback")
    if code == 0:
        return out
    if code not in (1, 2):
        out.add("exit code", f"exit {code}", f"exit {code}")
        return out
    if out.status == "ok":
        out.status = "clean"
    judge(out, stderr)
    return out


def check_cli(args: list[str], file: str, data: bytes, *, seconds: float = 10.0,
              kind: str = "yaml") -> Outcome:
    """Run ``kvspec ARGS`` in-process on the input ``data`` (already written at
    ``file``) and judge it."""
    return run_cli(args, lambda out, stderr: judge_messages(
        out, stderr, file, Positions(data, kind)), seconds=seconds)


def _probe_counts(layout: Any, st: Any, n0: int, cap: int = 60_000) -> list[int]:
    """Block counts to check the block-id property at: a few small ones, the
    smallest that serves and two larger -- those whose pages stay under ``cap``
    contiguous runs."""
    from tests.invariants import geometries
    runs = 0
    for t in st.tensors:
        for g in geometries(layout, st, t, 2):
            runs += len(g.runs()[0])
    counts = {1, 2, 3, 5, 8, 13, 64, 257, n0, n0 + 1, 2 * n0 + 3}
    return sorted(n for n in counts if n >= 1 and n * max(runs, 1) <= cap)


def check_valid(text: str, file: str = "fuzz.yaml", *, load: bool | None = None,
                seconds: float = 10.0) -> Outcome:
    """Compile a generated source; when it compiles, check the block-id property
    at several block counts, every invariant, that it reads back, and (with
    torch) that it loads on ``meta`` at its smallest block count and larger."""
    from kvspec.compiler import compile_source
    from kvspec.errors import KvspecError

    out = Outcome("ok")
    try:
        with time_limit(seconds):
            try:
                art = compile_source(text, file)
            except KvspecError as err:
                out.status = "clean"
                rendered = err.render()
                judge_messages(out, rendered, file, Positions(text.encode("utf-8")))
                return out
            _check_compiled(out, art, load)
    except (Exception, CaseTimeout) as exc:  # noqa: BLE001
        category, sig = _crash_signature(exc)
        out.add(category, f"{type(exc).__name__}: {str(exc)[:160]}", sig)
    return out


def check_against_vllm(text: str, workdir: str, *, seconds: float = 60.0) -> Outcome:
    """``kvspec verify --against vllm`` of a generated source that compiles (one
    that does not is ``clean``: vLLM is not asked). ``ok`` when the plans agree
    (``exit_code`` 0) or differ only by design (1); a defect when the command
    fails (a traceback, an exit code other than 0 and 1) or a difference has no
    by-design rule: its class is the differing fields, indices as ``[*]``, and
    for a refusal the error's type."""
    import os

    from kvspec.compiler import compile_source
    from kvspec.errors import KvspecError

    try:
        compile_source(text, "fuzz.yaml")
    except KvspecError:
        return Outcome("clean")
    path = os.path.join(workdir, "case.yaml")
    Path(path).write_text(text, encoding="utf-8")
    args = ["verify", path, "--against", "vllm", "--format", "json"]

    def judge(o: Outcome, stderr: str) -> None:   # exit 1 or 2 (run_cli judges others)
        if o.exit_code == 1:   # the plans differ: the JSON says whether by design
            o.status = "ok"
        else:
            first = stderr.strip().splitlines()[0] if stderr.strip() else ""
            o.add("cannot verify", first[:160], re.sub(r"\d+", "N", first.split(": ", 1)[-1])[:80])

    out = run_cli(args, judge, seconds=seconds)
    if out.status == "defect" or out.exit_code is None:
        return out
    rows = [d for d in json.loads(out.stdout)["differences"] if d["status"] != "by design"]
    fields = sorted({re.sub(r"\[\d+\]", "[*]", d["field"]) + (
        f" ({str(d['vllm']).split(':')[0].removeprefix('refused (')})"
        if d["field"] == "outcome" else "") for d in rows})
    if fields:
        out.add("unexplained difference", "; ".join(
            f"{d['field']}: kvspec {str(d['kvspec'])[:60]}, vLLM {str(d['vllm'])[:60]}"
            for d in rows[:3]), " | ".join(fields[:6]))
    return out


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


def _check_compiled(out: Outcome, art: Any, load: bool | None) -> None:
    from kvspec.artifact import Artifact
    from kvspec.errors import KvspecError
    from tests.invariants import block_overlaps, check_artifact

    layout = art.layout
    problems = list(check_artifact(art))
    n0 = max(art.min_num_blocks(), 1)
    for st in layout.stages:
        for n in _probe_counts(layout, st, n0):
            problems += block_overlaps(layout, st, n)
    for p in dict.fromkeys(problems):
        category = "invariant: block-overlap" if "block ids" in p else "invariant: other"
        out.add(category, p[:200], re.sub(r"\d+", "N", p)[:90])
    try:
        if Artifact.from_text(art.text()).text() != art.text():
            out.add("invariant: reads back", "the artifact reads back different", "reads back")
    except KvspecError as err:
        out.add("invariant: reads back", err.message[:200], re.sub(r"\d+", "N", err.message)[:90])
    if load is False or (load is None and not _has_torch()):
        return
    import kvspec
    names = set(layout.stage(0).layer_names)
    for n in (n0, n0 + 1, 2 * n0 + 3, 4 * n0 + 17):
        try:
            cache = kvspec.load(art, device="meta", num_blocks=n)
        except KvspecError as err:
            msg = re.sub(r"[\d,]+", "N", err.message)[:90]
            out.add("invariant: loads-on-meta", f"{n} blocks: {err.message[:180]}", msg)
            return
        if set(cache.views) != names:
            out.add("invariant: loads-on-meta", f"{n} blocks: views differ from stage 0's "
                    "layers", "views differ")
            return


# ---------------------------------------------------------------------------
# Hypothesis strategies
# ---------------------------------------------------------------------------

try:
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover  (the benchmark runs without it)
    st = None  # type: ignore[assignment]

if st is not None:
    _SOURCES = source_seeds()
    _DUMPS = dump_seeds()

    @st.composite
    def mutated_sources(draw: Any, big: bool = False) -> tuple[str, bytes, list[str]]:
        """(seed name, mutated bytes, mutations)."""
        name, data = draw(st.sampled_from(_SOURCES))
        rng = random.Random(draw(st.integers(0, 2**64 - 1)))
        out, ops = mutate_source(rng, data, others=[d for _, d in _SOURCES[:8]], big=big)
        return name, out, ops

    def _mutated(seeds: list[tuple[str, bytes]], mutate: Any) -> Any:
        """A strategy of (seed name, ``mutate`` of its bytes, mutations)."""
        @st.composite
        def strategy(draw: Any, big: bool = False) -> tuple[str, bytes, list[str]]:
            name, data = draw(st.sampled_from(seeds))
            rng = random.Random(draw(st.integers(0, 2**64 - 1)))
            out, ops = mutate(rng, data, big=big)
            return name, out, ops
        return strategy

    mutated_dumps = _mutated(_DUMPS, mutate_dump)
    mutated_configs = _mutated(config_seeds(), mutate_config)

    @st.composite
    def command_lines(draw: Any) -> list[str]:
        return cli_args(random.Random(draw(st.integers(0, 2**64 - 1))))

    @st.composite
    def valid_sources(draw: Any) -> tuple[str, dict[str, str]]:
        layout = draw(st.sampled_from(AXIS_ORDERS))
        family = draw(st.sampled_from(FAMILIES))
        rng = random.Random(draw(st.integers(0, 2**64 - 1)))
        return valid_source(rng, layout=layout, family=family)


if __name__ == "__main__":  # pragma: no cover  (print a few samples)
    r = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    print(valid_source(r)[0])
