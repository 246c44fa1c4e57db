"""Replays tests/conformance/blockpool-trace.json against kvspec's block pool.

The trace records, step by step, what the reference returned for its free-block
queue, its block hashing and its hash-list views. Steps carry state: the queue
is built by ``init``; the hash-list steps read the hashes of the latest
``hash_chain``. Each replayed step is its own test: it replays the steps before
it, then checks that step field by field.

The token-hashing steps (:data:`TOKEN_HASHING`) are not replayed: kvspec hashes no
tokens (its request-level manager keys blocks by ints, and a serving engine hashes
with its own functions), so a ``hash_chain`` only hands the reference's hashes to
the view steps after it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvspec.runtime.block_pool import Block, FreeBlockQueue
from kvspec.runtime.hashing import (
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
#: The reference's token-hashing steps, which kvspec does not replay (see above).
TOKEN_HASHING = frozenset({"none_hash", "hash_chain", "hash_with_extra_keys"})
REPLAYED = [i for i, step in enumerate(STEPS) if step["op"] not in TOKEN_HASHING]


class TraceReplay:
    """kvspec's answer to each trace step, keeping the state the steps share."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.queue: FreeBlockQueue | None = None
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

    # -- hash-list views ---------------------------------------------------

    def _op_hash_chain(self, step: dict[str, Any]) -> dict[str, Any]:
        self.chain = [bytes.fromhex(h) for h in step["hashes"]]
        return step

    def _op_none_hash(self, step: dict[str, Any]) -> dict[str, Any]:
        return step

    _op_hash_with_extra_keys = _op_none_hash

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


@pytest.mark.parametrize("index", REPLAYED, ids=_step_id)
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
