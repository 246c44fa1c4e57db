"""Multi-rank loading under torch.distributed (gloo, local processes).

Three processes join one gloo group (``file://`` rendezvous in tmp_path) and
run the same script of loads; each writes what it saw to ``rank<R>.json``.
Every collective has a timeout, and the parent kills the group if it overruns,
so a broken agreement fails the test instead of hanging it.
"""

from __future__ import annotations

import datetime
import json
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the runtime tests need torch "
                            "(pip install -e '.[runtime]')")
import torch.multiprocessing as mp  # noqa: E402

DATA = Path(__file__).parent / "data" / "runtime"
WORLD = 3
DEADLINE_S = 120


def _scenarios(rank: int, tmp: Path) -> dict[str, Any]:
    """The loads every rank runs, in the same order (one gloo group)."""
    from kvspec.compiler import compile
    from kvspec.errors import KvspecError
    from kvspec.runtime.distributed import RankMismatchError, agree, pipeline_rank
    from kvspec.runtime.loader import load

    tiny = compile(DATA / "tiny.yaml")
    other = compile(DATA / "tiny-other.yaml")
    pp3 = compile(DATA / "tiny-pp3.yaml")
    per_block = tiny.layout.stage(0).bytes_per_block
    out: dict[str, Any] = {}

    def attempt(key: str, fn) -> None:
        try:
            out[key] = {"ok": fn()}
        except RankMismatchError as err:
            out[key] = {"mismatch": err.message}
        except KvspecError as err:
            out[key] = {"error": f"{type(err).__name__}: {err.message}"}

    # 1. each rank offers a different count: every rank gets the smallest
    attempt("counts", lambda: load(tiny, device="cpu", num_blocks=20 + 5 * rank).num_blocks)
    # 2. each rank a different budget (bytes)
    attempt("memory", lambda: load(tiny, device="meta",
                                   memory=(30 - rank) * per_block).num_blocks)
    # 3. the artifact read from a file on every rank
    path = tmp / "tiny.kvlayout.json"
    attempt("path", lambda: tuple(load(path, device="meta", num_blocks=40 - rank)
                                  .views["model.layers.0.self_attn.attn"].shape))
    # 4. rank 1 loads another source
    attempt("mismatch", lambda: load(other if rank == 1 else tiny, device="meta",
                                     num_blocks=20).num_blocks)
    # 5. rank 2 cannot serve one request with its count
    attempt("too_small", lambda: load(tiny, device="meta",
                                      num_blocks=5 if rank == 2 else 20).num_blocks)
    # 6. rank 0's artifact file was edited after compiling
    tampered = tmp / "tampered.kvlayout.json"
    attempt("tampered", lambda: load(tampered if rank == 0 else path, device="meta",
                                     num_blocks=20).num_blocks)
    # 7. pipeline stages: rank r loads stage r by default
    attempt("stages", lambda: [pipeline_rank(pp3),
                               list(load(pp3, device="meta", num_blocks=17 + rank).views)])
    # 8. rank 2 compiled the same source with another budget: bodies differ
    budgeted = compile(DATA / "tiny.yaml", memory=64 * per_block)
    attempt("bodies", lambda: load(budgeted if rank == 2 else tiny, device="meta",
                                   num_blocks=20).num_blocks)
    # 9. agree() directly
    attempt("agree", lambda: agree(tiny, 100 - rank))
    return out


def _worker(rank: int, tmp: str) -> None:
    import torch.distributed as dist

    tmp_path = Path(tmp)
    result: dict[str, Any]
    try:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}",
                                rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=60))
        try:
            result = _scenarios(rank, tmp_path)
        finally:
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported to the parent through the result file
        result = {"crash": traceback.format_exc()}
    (tmp_path / f"rank{rank}.json").write_text(json.dumps(result))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    from kvspec.compiler import compile

    tmp = tmp_path_factory.mktemp("gloo")
    art = compile(DATA / "tiny.yaml")
    art.write(tmp / "tiny.kvlayout.json")
    data = json.loads(art.text())
    data["body"]["engine"]["max_model_len"] = 128
    (tmp / "tampered.kvlayout.json").write_text(json.dumps(data))
    ctx = mp.start_processes(_worker, args=(str(tmp),), nprocs=WORLD, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"the {WORLD} ranks did not finish in {DEADLINE_S}s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
    out = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for r, res in enumerate(out):
        assert "crash" not in res, f"rank {r} crashed:\n{res['crash']}"
    return out


def test_ranks_agree_on_the_smallest_count(results: list[dict[str, Any]]) -> None:
    assert [r["counts"] for r in results] == [{"ok": 20}] * WORLD
    assert [r["memory"] for r in results] == [{"ok": 28}] * WORLD
    assert [r["path"] for r in results] == [{"ok": [38, 2, 16, 128]}] * WORLD
    assert [r["agree"] for r in results] == [{"ok": 98}] * WORLD


def test_a_different_source_is_refused_on_every_rank(results: list[dict[str, Any]]) -> None:
    messages = [r["mismatch"].get("mismatch") for r in results]
    assert all(messages) and len(set(messages)) == 1, messages
    msg = messages[0]
    assert msg.startswith("the ranks loaded artifacts of different sources")
    assert "ranks 0, 2: 'tiny' source" in msg and "rank 1: 'tiny-other' source" in msg


def test_the_same_source_compiled_differently_is_refused(
        results: list[dict[str, Any]]) -> None:
    messages = {r["bodies"].get("mismatch") for r in results}
    assert len(messages) == 1
    msg = messages.pop()
    assert msg.startswith("the ranks loaded artifacts of different bodies from one source")
    assert "ranks 0, 1: 'tiny'" in msg and "rank 2: 'tiny'" in msg


def test_a_rank_that_cannot_serve_a_request_stops_them_all(
        results: list[dict[str, Any]]) -> None:
    messages = [r["too_small"].get("mismatch") for r in results]
    assert all(messages) and len(set(messages)) == 1, messages
    assert messages[0].startswith("not every rank can load its KV cache: rank 2: "
                                  "5 blocks cannot serve one request")


def test_a_rank_with_a_tampered_artifact_stops_them_all(
        results: list[dict[str, Any]]) -> None:
    messages = [r["tampered"].get("mismatch") for r in results]
    assert all(messages) and len(set(messages)) == 1, messages
    assert messages[0].startswith("not every rank can load its KV cache: rank 0: the "
                                  "artifact does not match its sha256")


def test_each_rank_loads_its_pipeline_stage(results: list[dict[str, Any]]) -> None:
    for rank, res in enumerate(results):
        stage, layers = res["stages"]["ok"]
        assert stage == rank
        assert layers == [f"model.layers.{2 * rank + i}.self_attn.attn" for i in range(2)]


def test_single_process_needs_no_agreement() -> None:
    from kvspec.compiler import compile
    from kvspec.runtime.distributed import is_initialized, pipeline_rank
    from kvspec.runtime.loader import load

    assert not is_initialized()
    pp3 = compile(DATA / "tiny-pp3.yaml")
    assert pipeline_rank(pp3) == 0
    assert load(pp3, device="meta", num_blocks=30).stage == 0
    assert torch.distributed.is_available()
