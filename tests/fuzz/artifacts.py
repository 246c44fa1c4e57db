"""Fuzzing the artifact reader: committed artifacts, edited, their hash recomputed
or not, written canonically or otherwise, sometimes broken as text.

Each case is read by ``kvspec explain FILE`` (in-process: exit 0, 1 or 2, no
traceback, every message up to the bar) and by both readers: ``Artifact.from_text``
(what ``load`` runs: format, hash, structure) and ``kvspec.compiled.verified``
(which also re-plans). Whatever re-planning accepts the reader accepts too, as
the same artifact; what the reader accepts beyond it must be structurally sound,
which its own checks decide (tests/test_artifact_reading.py holds them against a
brute-force oracle).
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

from tests.fuzz.generators import (
    ROOT,
    CaseTimeout,
    Outcome,
    _crash_signature,
    _dump_text_op,
    _get,
    _paths,
    _set,
    check_cli,
    m_flip_bits,
    time_limit,
    tree_edit,
)

#: Values an edit puts in, beside the retypes: near misses of what artifacts hold.
_VALUES: list[Any] = [0, 1, -1, 2, 15, 16, 17, 4096, 2**31, 2**63, 2**64 + 1, 1.5, 16.0,
                      True, False, None, "", "auto", "fp8", "bfloat16", "LBNHC", "BLHNC",
                      "full_attention", "sliding_window", "mamba", [], {}, [0], {"fixed": 0},
                      {"per_block": 1, "fixed": 0}]


def artifact_seeds(root: Path = ROOT) -> list[tuple[str, bytes]]:
    """Every committed artifact (layouts/), as an artifact to edit."""
    return [(str(p.relative_to(root)), p.read_bytes())
            for p in sorted(root.glob("layouts/*.kvlayout.json"))]


def _nudged(rng: random.Random, value: Any) -> Any:
    if type(value) is int:
        return rng.choice([value + 1, value - 1, value * 2, value // 2, 0, -value])
    if type(value) is str:
        return rng.choice([value + "x", value.upper(), value[:-1], "auto", ""])
    return copy.deepcopy(rng.choice(_VALUES))


def _op(rng: random.Random, obj: Any) -> tuple[Any, str]:
    """One edit of the artifact's tree (mostly of its body's leaves)."""
    paths = list(_paths(obj))
    body = [p for p in paths if p[:1] == ("body",)] or paths
    path = rng.choice(body if rng.random() < 0.9 else paths)
    op = rng.choice(["nudge", "nudge", "nudge", "retype", "value", "drop", "add", "nest",
                     "rename", "swap"])
    if op == "nudge":
        return _set(obj, path, _nudged(rng, _get(obj, path))), op
    keys = sorted({p[-1] for p in paths if p and isinstance(p[-1], str)})
    edited = tree_edit(rng, obj, path, op, keys, _VALUES)
    if edited is not None:
        return edited
    if op == "swap":
        other = rng.choice(body)
        a, b = _get(obj, path), _get(obj, other)
        if not (other[:len(path)] == path or path[:len(other)] == other):
            obj = _set(_set(obj, path, copy.deepcopy(b)), other, copy.deepcopy(a))
            return obj, op
    return _set(obj, path, copy.deepcopy(rng.choice(_VALUES))), "value"


def mutate_artifact(rng: random.Random, data: bytes) -> tuple[bytes, list[str]]:
    """An artifact with one to three edits, its hash recomputed most of the time
    (so the edit reaches the re-plan), written as kvspec writes artifacts or
    otherwise; sometimes its text edited or its bits flipped."""
    import msgspec

    from tests.conftest import signature_of

    obj: Any = json.loads(data)
    ops = []
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        obj, name = _op(rng, obj)
        ops.append(name)
    if isinstance(obj, dict) and rng.random() < 0.75:
        obj.pop("sha256", None)
        try:
            obj["sha256"] = signature_of(obj)
            ops.append("rehash")
        except (ValueError, TypeError, RecursionError):
            pass
    indent = rng.choice(["canonical", "canonical", None, 2])
    try:
        text = msgspec.json.format(msgspec.json.encode(obj, order="sorted"), indent=1).decode() \
            if indent == "canonical" else json.dumps(obj, indent=indent)
        text.encode("utf-8")
    except (ValueError, TypeError, RecursionError, OverflowError, UnicodeError,
            msgspec.EncodeError):  # a lone surrogate: written escaped
        text = json.dumps(obj)
    if rng.random() < 0.2:
        text, name = _dump_text_op(rng, text, rng.random() < 0.3)
        ops.append(name)
    raw = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.03:
        return m_flip_bits(rng, raw), ops + ["flip_bits"]
    return raw, ops


def _verdict(read: Any) -> tuple[str, Any]:
    from kvspec.errors import ArtifactError
    try:
        return "accepted", read().data
    except ArtifactError:
        return "refused", None


def check_artifact(data: bytes, file: str, *, seconds: float = 10.0) -> Outcome:
    """``kvspec explain FILE`` of an edited artifact, and its two readers compared."""
    out = check_cli(["explain", file], file, data, seconds=seconds, kind="json")
    if out.status == "defect":
        return out
    from kvspec.artifact import Artifact
    from kvspec.compiled import verified
    try:
        text = data.decode("utf-8")
    except ValueError:  # not text: the command judged it
        return out
    try:
        with time_limit(seconds):
            fast = _verdict(lambda: Artifact.from_text(text, origin=file))
            full = _verdict(lambda: verified(text, origin=file))
    except (Exception, CaseTimeout) as exc:  # noqa: BLE001 - anything escaping is a defect
        category, sig = _crash_signature(exc)
        out.add(category, f"{type(exc).__name__}: {str(exc)[:160]}", sig)
        return out
    if full[0] == "accepted" and fast[0] != "accepted":
        out.add("reader: refuses what re-planning accepts", "from_text refused, verified "
                "accepted", "from_text refused, verified accepted")
    elif full[0] == "accepted" and json.dumps(fast[1], sort_keys=True) != \
            json.dumps(full[1], sort_keys=True):
        out.add("reader: accepted artifacts differ", "from_text and verified accept "
                "different data", "accepted data differ")
    return out


def mutated_artifacts() -> Any:
    """A hypothesis strategy of (seed name, mutated artifact bytes, edits)."""
    from hypothesis import strategies as st

    seeds = artifact_seeds()

    @st.composite
    def strategy(draw: Any) -> tuple[str, bytes, list[str]]:
        name, data = draw(st.sampled_from(seeds))
        out, ops = mutate_artifact(random.Random(draw(st.integers(0, 2**64 - 1))), data)
        return name, out, ops

    return strategy()
