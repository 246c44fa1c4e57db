"""Replays tests/conformance/blockpool-trace.json against kvspec's block pool.

The trace records, step by step, what the reference returned for its free-block
queue, its block hashing and its hash-list views. Steps carry state: the queue
is built by ``init``; ``none_hash`` (and a ``hash_chain`` naming ``hash_fn``)
sets the hash function and seed later hash steps use; the hash-list steps read
the hashes of the latest ``hash_chain``. Each step is its own test: it replays
the steps before it, then checks that step field by field.

``seed`` is the PYTHONHASHSEED the reference ran under; it is passed to the
hasher explicitly, whatever this process's environment says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvspec.runtime.block_pool import Block, FreeBlockQueue
from kvspec.runtime.hashing import (
    BlockHasher,
    BlockHashListWithBlockSize,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
)

TRACE_PATH = Path(__file__).resolve().parent / "conformance" / "blockpool-trace.json"

if not TRACE_PATH.exists():  # pragma: no cover - the checkout lacks shared/
    pytest.skip(f"no trace at {TRACE_PATH}", allow_module_level=True)

TRACE: dict[str, Any] = json.loads(TRACE_PATH.read_text())
STEPS: list[dict[str, Any]] = TRACE["steps"]


class TraceReplay:
    """kvspec's answer to each trace step, keeping the state the steps share."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.queue: FreeBlockQueue | None = None
        self.hasher: BlockHasher | None = None
        self.chain: list[bytes] = []

    def free_ids(self) -> list[int]:
        assert self.queue is not None, "the trace must start with init"
        return [b.block_id for b in self.queue.get_all_free_blocks()]

    def apply(self, step: dict[str, Any]) -> dict[str, Any]:
        """Run one step; return it as kvspec would record it (inputs echoed)."""
        op = step["op"]
        handler = getattr(self, f"_op_{op}", None)
        if handler is None:
            raise AssertionError(f"trace op {op!r} has no replay")
        return {"op": op, **handler(step)}

    # -- free-block queue --------------------------------------------------

    def _op_init(self, step: dict[str, Any]) -> dict[str, Any]:
        self.blocks = [Block(i) for i in range(step["num_blocks"])]
        self.queue = FreeBlockQueue(self.blocks)
        return {"num_blocks": step["num_blocks"], "free": self.free_ids()}

    def _op_popleft(self, step: dict[str, Any]) -> dict[str, Any]:
        got = self.queue.popleft().block_id
        return {"got": got, "free": self.free_ids()}

    def _op_popleft_n(self, step: dict[str, Any]) -> dict[str, Any]:
        got = [b.block_id for b in self.queue.popleft_n(step["n"])]
        return {"n": step["n"], "got": got, "free": self.free_ids()}

    def _op_remove(self, step: dict[str, Any]) -> dict[str, Any]:
        self.queue.remove(self.blocks[step["block"]])
        return {"block": step["block"], "free": self.free_ids()}

    def _op_append(self, step: dict[str, Any]) -> dict[str, Any]:
        self.queue.append(self.blocks[step["block"]])
        return {"block": step["block"], "free": self.free_ids()}

    def _op_append_n(self, step: dict[str, Any]) -> dict[str, Any]:
        self.queue.append_n([self.blocks[i] for i in step["blocks"]])
        return {"blocks": step["blocks"], "free": self.free_ids()}

    def _op_prepend_n(self, step: dict[str, Any]) -> dict[str, Any]:
        self.queue.prepend_n([self.blocks[i] for i in step["blocks"]])
        return {"blocks": step["blocks"], "free": self.free_ids()}

    def _op_num_free_blocks(self, step: dict[str, Any]) -> dict[str, Any]:
        return {"value": self.queue.num_free_blocks}

    def _op_iter_blocks_after(self, step: dict[str, Any]) -> dict[str, Any]:
        cursor = None if step["cursor"] is None else self.blocks[step["cursor"]]
        order = [b.block_id for b in self.queue.iter_blocks_after(cursor)]
        return {"cursor": step["cursor"], "order": order}

    # -- hashing -----------------------------------------------------------

    def _set_hasher(self, step: dict[str, Any]) -> dict[str, Any]:
        self.hasher = BlockHasher.create(step["hash_fn"], seed=step["seed"])
        return {
            "hash_fn": step["hash_fn"],
            "seed": step["seed"],
            "none_hash": self.hasher.none_hash.hex(),
        }

    def _op_none_hash(self, step: dict[str, Any]) -> dict[str, Any]:
        return self._set_hasher(step)

    def _op_hash_chain(self, step: dict[str, Any]) -> dict[str, Any]:
        out = self._set_hasher(step) if "hash_fn" in step else {}
        assert self.hasher is not None, "a hash step needs a hash function first"
        self.chain = self.hasher.hash_blocks(step["tokens"], step["block_size"])
        return {
            **out,
            "block_size": step["block_size"],
            "tokens": step["tokens"],
            "hashes": [h.hex() for h in self.chain],
        }

    def _op_hash_with_extra_keys(self, step: dict[str, Any]) -> dict[str, Any]:
        block_hash = self.hasher.hash_block(None, step["tokens"], tuple(step["extra_keys"]))
        return {
            "tokens": step["tokens"],
            "extra_keys": step["extra_keys"],
            "hash": block_hash.hex(),
        }

    def _op_block_hash_list_with_block_size(self, step: dict[str, Any]) -> dict[str, Any]:
        view = BlockHashListWithBlockSize(
            self.chain, step["hash_block_size"], step["target_block_size"]
        )
        return {
            "hash_block_size": step["hash_block_size"],
            "target_block_size": step["target_block_size"],
            "hashes": [h.hex() for h in view],
        }

    def _op_block_hash_with_group_id(self, step: dict[str, Any]) -> dict[str, Any]:
        key = make_block_hash_with_group_id(self.chain[0], step["group_id"])
        return {
            "group_id": step["group_id"],
            "key": key.hex(),
            "unpacked_group": get_group_id(key),
            "unpacked_hash": get_block_hash(key).hex(),
        }


def _replay(upto: int) -> dict[str, Any]:
    replay = TraceReplay()
    for step in STEPS[:upto]:
        replay.apply(step)
    return replay.apply(STEPS[upto])


def _step_id(i: int) -> str:
    return f"{i:02d}-{STEPS[i]['op']}"


@pytest.mark.parametrize("index", range(len(STEPS)), ids=_step_id)
def test_trace_step(index: int) -> None:
    expected = STEPS[index]
    observed = _replay(index)
    missing = sorted(set(expected) - set(observed))
    assert not missing, f"the replay records no {missing}"
    assert {key: observed[key] for key in expected} == expected


def test_trace_replays_in_one_pass() -> None:
    replay = TraceReplay()
    for step in STEPS:
        observed = replay.apply(step)
        assert {key: observed.get(key) for key in step} == step


def test_trace_notes_match_the_hash_functions() -> None:
    notes = TRACE["notes"]
    assert "cbor2.dumps(obj, canonical=True)" in notes["sha256_cbor"]
    assert "pickle.HIGHEST_PROTOCOL" in notes["sha256"]
    assert "PYTHONHASHSEED" in notes["none_hash"]


def test_trace_seed_is_not_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "12345")
    first_hash_step = next(i for i, s in enumerate(STEPS) if s["op"] == "none_hash")
    assert _replay(first_hash_step) == STEPS[first_hash_step]
