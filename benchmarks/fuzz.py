"""Fuzz kvspec locally: tens of thousands of mutated sources, mutated dumps,
mutated Hugging Face configs, command lines and generated valid sources, over
every core, and print the counts.

    python benchmarks/fuzz.py --sources 20000 --dumps 5000 --configs 5000 --artifacts 5000 \
        --args 5000 --valid 12000 --seed 0 --jobs 2

* mutated sources: ``kvspec validate FILE`` in-process; counted as compiled (exit
  0), clean errors (exit 1/2, every message up to the bar) or defects;
* mutated dumps: ``kvspec import FILE`` likewise;
* mutated configs: ``kvspec init --from-hf FILE`` likewise (with a flag or two,
  picked by the file's bytes), and a source it writes must compile;
* mutated artifacts: the committed ``layouts/*.kvlayout.json`` edited (the hash
  recomputed most of the time), ``kvspec explain FILE`` likewise; and reading the
  text (``Artifact.from_text``, the orjson fast path first) must give the verdict
  ``verified`` gives of ``json``'s parse (tests/fuzz/artifacts.py);
* command lines: every command with some of its options, hostile values and
  files that exist or not (tests/fuzz/generators.py: ``CLI_FILES``): exit 0, 1
  or 2, no traceback, every message with a hint;
* generated valid sources: compiled (and then: the block-id property at several
  block counts, every invariant, reading back, loading on ``meta`` at the
  smallest block count and larger), refused cleanly, or a violation, per axis
  order;
* ``--against-vllm N`` (run it with the vLLM venv's python): N more generated
  sources, each that compiles checked with ``kvspec verify --against vllm``; a
  difference from vLLM 0.33.0 that no by-design rule explains is a defect, its
  class the fields that differ.

A defect is a traceback (any exception out of ``kvspec.cli.main``), a
``RecursionError``, a ``MemoryError``, a case over ``--time-limit`` seconds, a
worker that died, or a message below the bar (tests/fuzz/generators.py: no
``line:col`` where the input has a position, no ``hint:``, a first line not
``FILE[:LINE:COL]: error:``). Every case is
reproducible from ``--seed`` and its index; after the run, the smallest input
of every defect class is minimised and saved under ``--out`` with the command
that shows it (``README.txt`` there lists them), and ``summary.json`` holds the
counts.

Workers are forked from a parent that has imported all of kvspec (and torch,
when present), so a run sees one state of the code; each has an address-space
limit (``--memory-limit``) and a per-case alarm, and the parent kills and
replaces a worker stuck past the limit.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import importlib.util
import json
import multiprocessing as mp
import os
import pkgutil
import queue
import random
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvspec.cli.common import progress  # noqa: E402 - after the path set-up
from tests.fuzz import artifacts as a  # noqa: E402
from tests.fuzz import generators as g  # noqa: E402

KINDS = ("source", "dump", "config", "artifact", "args", "valid", "vllm")


# ---------------------------------------------------------------------------
# one case
# ---------------------------------------------------------------------------

_SEEDS: dict[str, list[tuple[str, bytes]]] = {}


def make_case(kind: str, seed: int, i: int) -> tuple[bytes, dict[str, Any]]:
    """The input of case ``i`` of ``kind``: its bytes and what it is."""
    rng = random.Random(f"{seed}:{kind}:{i}")
    if kind == "source":
        seeds = _SEEDS.setdefault("source", g.source_seeds())
        name, data = seeds[i % len(seeds)] if i < len(seeds) else rng.choice(seeds)
        out, ops = g.mutate_source(rng, data, others=[d for _, d in seeds])
        return out, {"seed_file": name, "ops": ops}
    if kind == "dump":
        seeds = _SEEDS.setdefault("dump", g.dump_seeds())
        name, data = rng.choice(seeds)
        out, ops = g.mutate_dump(rng, data)
        return out, {"seed_file": name, "ops": ops}
    if kind == "args":
        args = g.cli_args(rng)
        return "\0".join(args).encode("utf-8", "surrogatepass"), {"args": args}
    if kind == "config":
        seeds = _SEEDS.setdefault("config", g.config_seeds())
        name, data = rng.choice(seeds)
        out, ops = g.mutate_config(rng, data)
        return out, {"seed_file": name, "ops": ops}
    if kind == "artifact":
        seeds = _SEEDS.setdefault("artifact", a.artifact_seeds())
        name, data = rng.choice(seeds)
        out, ops = a.mutate_artifact(rng, data)
        return out, {"seed_file": name, "ops": ops}
    if kind == "vllm":   # any family and axis order, as the generator draws them
        text, meta = g.valid_source(rng)
        return text.encode("utf-8"), meta
    layout = g.AXIS_ORDERS[i % len(g.AXIS_ORDERS)]
    family = g.FAMILIES[(i // len(g.AXIS_ORDERS)) % len(g.FAMILIES)]
    text, meta = g.valid_source(rng, layout=layout, family=family)
    return text.encode("utf-8"), meta


def case_file(workdir: str, kind: str) -> str:
    if kind == "artifact":
        return os.path.join(workdir, "case.kvlayout.json")
    return os.path.join(workdir, "case.json" if kind in ("dump", "config") else "case.yaml")


def command(kind: str, file: str) -> list[str]:
    return ["import", file] if kind == "dump" else ["validate", file]


def judge(kind: str, data: bytes, workdir: str, limit: float) -> g.Outcome:
    if kind == "valid":
        return g.check_valid(data.decode("utf-8"), "fuzz.yaml", seconds=limit)
    if kind == "vllm":
        return g.check_against_vllm(data.decode("utf-8"), workdir, seconds=max(limit, 60))
    if kind == "args":
        return g.check_args(data.decode("utf-8", "surrogatepass").split("\0"), workdir,
                            seconds=limit)
    file = case_file(workdir, kind)
    with open(file, "wb") as fh:
        fh.write(data)
    if kind == "config":
        return g.check_init(file, data, seconds=limit)
    if kind == "artifact":
        return a.check_artifact(data, file, seconds=limit)
    return g.check_cli(command(kind, file), file, data, seconds=limit,
                       kind="json" if kind == "dump" else "yaml")


# ---------------------------------------------------------------------------
# minimising a reproducer
# ---------------------------------------------------------------------------


def _still(kind: str, data: bytes, signature: str, workdir: str, limit: float) -> bool:
    if kind in ("valid", "vllm"):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return False
    return signature in judge(kind, data, workdir, limit).signatures


def _ddmin(parts: list[bytes], keep: Any, budget: list[int]) -> list[bytes]:
    """Zeller's ddmin over ``parts`` while ``keep(parts)`` holds."""
    n = 2
    while len(parts) >= 2 and budget[0] > 0:
        chunk = max(len(parts) // n, 1)
        reduced = False
        for start in range(0, len(parts), chunk):
            if budget[0] <= 0:
                break
            candidate = parts[:start] + parts[start + chunk:]
            budget[0] -= 1
            if candidate and keep(candidate):
                parts, n, reduced = candidate, max(n - 1, 2), True
                break
        if not reduced:
            if chunk == 1:
                break
            n = min(n * 2, len(parts))
    return parts


def _json_shrink(obj: Any, keep: Any, budget: list[int]) -> Any:
    """Drop list items and mapping keys greedily while ``keep`` holds."""
    changed = True
    while changed and budget[0] > 0:
        changed = False
        for path in sorted(g._paths(obj), key=len):
            if not path or budget[0] <= 0:
                continue
            try:
                parent = g._get(obj, path[:-1])
                trial = json.loads(json.dumps(obj))
                del g._get(trial, path[:-1])[path[-1]]
            except (KeyError, IndexError, TypeError):
                continue
            budget[0] -= 1
            if keep(trial):
                obj, changed = trial, True
                del parent
                break
    return obj


def minimise(kind: str, data: bytes, signature: str, workdir: str, limit: float,
             trials: int = 250) -> bytes:
    budget = [trials]
    if kind == "args":   # a command line: its words
        words = data.split(b"\0")
        return b"\0".join(_ddmin(words, lambda p: bool(p) and _still(
            kind, b"\0".join(p), signature, workdir, limit), budget))
    def ok(b: bytes) -> bool:
        return _still(kind, b, signature, workdir, limit)

    if kind in ("dump", "config", "artifact"):
        try:
            obj = json.loads(data)
            def dumped(o: Any) -> bytes:
                return json.dumps(o, indent=1).encode("utf-8", "surrogatepass")

            if ok(dumped(obj)):
                obj = _json_shrink(obj, lambda o: ok(dumped(o)), budget)
                data = dumped(obj)
        except (ValueError, RecursionError):
            pass
    join = b"".join
    lines = _ddmin(data.splitlines(keepends=True), lambda p: ok(join(p)), budget)
    data = join(lines)
    if len(data) > 4000 and budget[0] > 0:   # one long line: chunks of it
        size = len(data) // 128
        parts = [data[i:i + size] for i in range(0, len(data), size)]
        data = join(_ddmin(parts, lambda p: ok(join(p)), budget))
    if len(data) <= 4000 and budget[0] > 0:   # then characters (bytes), for small inputs
        parts = [data[i:i + 1] for i in range(len(data))]
        data = join(_ddmin(parts, lambda p: ok(join(p)), budget))
    return data


# ---------------------------------------------------------------------------
# workers
# ---------------------------------------------------------------------------


def _vm_size() -> int:
    with contextlib.suppress(OSError), open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def worker(wid: int, tasks: Any, results: Any, limit: float, memory: int) -> None:
    workdir = tempfile.mkdtemp(prefix=f"kvspec-fuzz-w{wid}-")
    if memory > 0:
        cap = _vm_size() + memory
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    with contextlib.suppress(Exception):
        import torch
        torch.set_num_threads(1)
    while True:
        task = tasks.get()
        if task is None:
            return
        op, kind, seed, i, extra = task
        results.put(("start", wid, kind, i, time.time()))
        try:
            if op == "run":
                data, meta = make_case(kind, seed, i)
                out = judge(kind, data, workdir, limit)
                raw = data if out.status == "defect" else None
                results.put(("done", wid, kind, i, _summary(out, meta, raw)))
            else:   # minimise
                data, signature = extra
                small = minimise(kind, data, signature, workdir, limit)
                results.put(("minimised", wid, kind, i, (signature, small)))
        except MemoryError:
            results.put(("done", wid, kind, i, {"status": "defect", "defects": ["MemoryError"],
                                                "signatures": ["MemoryError | worker"],
                                                "details": ["MemoryError in the worker"],
                                                "meta": {}, "raw": None, "messages": 0,
                                                "no_pos": 0, "no_hint": 0}))


def _summary(out: g.Outcome, meta: dict[str, Any], raw: bytes | None) -> dict[str, Any]:
    return {"status": out.status, "defects": out.defects, "signatures": out.signatures,
            "details": out.details, "meta": meta, "raw": raw, "messages": out.messages,
            "exit_code": out.exit_code,
            "no_pos": out.messages_without_position,
            "no_hint": out.messages_without_hint}


class Pool:
    """Workers with a hard per-task limit: a stuck or dead worker is replaced."""

    def __init__(self, jobs: int, limit: float, memory: int) -> None:
        self.ctx = mp.get_context("fork")
        self.tasks = self.ctx.Queue()
        self.results = self.ctx.Queue()
        self.limit, self.memory = limit, memory
        self.procs: dict[int, Any] = {}
        self.current: dict[int, tuple[str, int, float]] = {}
        self.next_id = 0
        for _ in range(jobs):
            self._spawn()

    def _spawn(self) -> None:
        wid = self.next_id
        self.next_id += 1
        p = self.ctx.Process(target=worker, args=(wid, self.tasks, self.results, self.limit,
                                                  self.memory), daemon=True)
        p.start()
        self.procs[wid] = p

    def put(self, task: tuple) -> None:
        self.tasks.put(task)

    def results_until(self, pending: int, hard: float) -> Any:
        """Yield results; a worker past ``hard`` seconds or dead yields a 'lost'."""
        while pending:
            try:
                msg = self.results.get(timeout=1.0)
            except queue.Empty:
                msg = None
            if msg is not None:
                tag, wid, kind, i, payload = msg
                if tag == "start":
                    self.current[wid] = (kind, i, payload)
                    continue
                self.current.pop(wid, None)
                pending -= 1
                yield tag, kind, i, payload
                continue
            now = time.time()
            for wid, p in list(self.procs.items()):
                started = self.current.get(wid)
                stuck = started is not None and now - started[2] > hard
                if stuck or not p.is_alive():
                    if p.is_alive():
                        p.kill()
                    p.join(5)
                    code = p.exitcode
                    del self.procs[wid]
                    self.current.pop(wid, None)
                    self._spawn()
                    if started is not None:
                        pending -= 1
                        yield "lost", started[0], started[1], \
                            "hard timeout" if stuck else f"worker died (exit {code})"

    def close(self) -> None:
        for _ in self.procs:
            self.tasks.put(None)
        for p in self.procs.values():
            p.join(5)
            if p.is_alive():
                p.kill()


# ---------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------


def preimport() -> None:
    """Import all of kvspec (and torch) once, before forking the workers."""
    import kvspec
    from kvspec.integrations.vllm import OFFLINE_ENV
    for key, value in OFFLINE_ENV.items():  # as the kvspec command sets them before
        os.environ.setdefault(key, value)   # vLLM is imported (the adapter modules import it)
    for mod in pkgutil.walk_packages(kvspec.__path__, "kvspec."):
        if mod.name.endswith("__main__"):
            continue
        with contextlib.suppress(Exception):   # optional integrations, e.g. vllm
            importlib.import_module(mod.name)
    with contextlib.suppress(Exception):
        import torch  # noqa: F401
    import tests.conftest  # noqa: F401


class Tally:
    def __init__(self) -> None:
        self.counts: dict[str, Counter] = {k: Counter() for k in KINDS}
        self.defects: dict[str, Counter] = {k: Counter() for k in KINDS}
        self.by_layout: dict[str, Counter] = defaultdict(Counter)
        self.by_family: dict[str, Counter] = defaultdict(Counter)
        self.classes: dict[str, dict[str, Any]] = {}
        self.slow: list[tuple[str, int, float, dict[str, Any]]] = []

    def add(self, kind: str, i: int, r: dict[str, Any]) -> None:
        c = self.counts[kind]
        c["tried"] += 1
        c[r["status"]] += 1
        c["messages"] += r["messages"]
        c["no_pos"] += r["no_pos"]
        c["no_hint"] += r["no_hint"]
        if r.get("slow_under_load") is not None:
            c["slow under load"] += 1
            self.slow.append((kind, i, r["slow_under_load"], r["meta"]))
        for cat in dict.fromkeys(_group(d) for d in r["defects"]):
            self.defects[kind][cat] += 1
        if kind == "vllm" and r["status"] == "ok":
            c["agree" if r.get("exit_code") == 0 else "by design only"] += 1
        if kind == "valid":
            meta = r["meta"]
            for key, table in ((meta.get("layout"), self.by_layout),
                               (meta.get("family"), self.by_family)):
                table[key]["tried"] += 1
                table[key][r["status"]] += 1
                for cat in dict.fromkeys(_group(d) for d in r["defects"]):
                    table[key][cat] += 1
        for sig, detail in zip(r["signatures"], r["details"]):
            entry = self.classes.setdefault(f"{kind}: {sig}", {
                "kind": kind, "signature": sig, "count": 0, "first": i, "detail": detail,
                "meta": r["meta"], "raw": r["raw"]})
            entry["count"] += 1
            raw = r["raw"]
            if raw is not None and (entry["raw"] is None or len(raw) < len(entry["raw"])):
                entry.update(raw=raw, first=i, detail=detail, meta=r["meta"])


def _group(category: str) -> str:
    return category


def run(args: argparse.Namespace) -> dict[str, Any]:
    preimport()
    pool = Pool(args.jobs, args.time_limit, args.memory_limit << 20)
    tally = Tally()
    plan = [("source", args.sources), ("dump", args.dumps), ("config", args.configs),
            ("artifact", args.artifacts), ("args", args.args), ("valid", args.valid),
            ("vllm", args.against_vllm)]
    t0 = time.time()
    phase_time = {}
    results: dict[tuple[str, int], dict[str, Any]] = {}
    for kind, n in plan:
        if not n:
            continue
        t = time.time()
        for i in range(n):
            pool.put(("run", kind, args.seed, i, None))
        with progress(n, label=f"fuzz {kind}") as bar:  # a bar on a terminal only
            for done, (tag, k, i, payload) in enumerate(
                    pool.results_until(n, args.time_limit + 20), 1):
                results[(k, i)] = _lost(k, args.seed, i, payload) if tag == "lost" else payload
                bar.advance()
                if args.progress and done % args.progress == 0 and not bar.enabled:
                    print(f"  {kind}: {done}/{n} ({time.time() - t:.0f} s)", file=sys.stderr,
                          flush=True)
        phase_time[kind] = time.time() - t
    run_time = time.time() - t0
    confirm_timeouts(pool, results, args)
    for (k, i), payload in results.items():
        tally.add(k, i, payload)
    reproducers = minimise_all(pool, tally, args)
    pool.close()
    return {"tally": tally, "run_time": run_time, "phase_time": phase_time,
            "reproducers": reproducers}


def _lost(kind: str, seed: int, i: int, why: str) -> dict[str, Any]:
    data, meta = make_case(kind, seed, i)
    cat = "timeout" if why == "hard timeout" else "crash (worker died)"
    return {"status": "defect", "defects": [cat], "signatures": [f"{cat} | {why}"],
            "details": [why], "meta": meta, "raw": data, "messages": 0, "no_pos": 0,
            "no_hint": 0}


def confirm_timeouts(pool: Pool, results: dict[tuple[str, int], dict[str, Any]],
                     args: argparse.Namespace) -> None:
    """Run every case that timed out again, alone: one that then finishes in
    time is counted as ``slow under load`` (it took over the limit only while
    every core was busy), with the seconds it took alone."""
    slow = [key for key, r in results.items() if "timeout" in r["defects"]]
    for kind, i in slow:
        t = time.time()
        pool.put(("run", kind, args.seed, i, None))
        for tag, k, j, payload in pool.results_until(1, args.time_limit + 20):
            again = _lost(k, args.seed, j, payload) if tag == "lost" else payload
        took = time.time() - t
        if "timeout" in again["defects"]:
            continue
        again["slow_under_load"] = round(took, 1)
        results[(kind, i)] = again


def minimise_all(pool: Pool, tally: Tally, args: argparse.Namespace) -> dict[str, bytes]:
    """Minimise one input per defect class, within ``--minimise-budget`` seconds."""
    todo = [(sig, e) for sig, e in sorted(tally.classes.items(), key=lambda x: -x[1]["count"])
            if e["raw"] is not None]
    small: dict[str, bytes] = {sig: e["raw"] for sig, e in todo}
    slow = ("timeout", "MemoryError", "crash (worker died)")
    queued = 0
    deadline = time.time() + args.minimise_budget
    for _, e in todo:
        if e["signature"].split(" | ")[0] in slow or len(e["raw"]) > 300_000:
            continue
        pool.put(("minimise", e["kind"], args.seed, e["first"], (e["raw"], e["signature"])))
        queued += 1
    if not queued:
        return small
    try:
        for tag, _k, _, payload in pool.results_until(queued, max(args.time_limit * 260, 600)):
            if tag == "minimised":
                sig, data = payload
                key = f"{_k}: {sig}"
                if len(data) < len(small[key]):
                    small[key] = data
            if time.time() > deadline:
                print("  minimising: budget spent, keeping the rest unminimised",
                      file=sys.stderr)
                break
    except KeyboardInterrupt:
        pass
    return small


# ---------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------

_MUTATED = (("source", "mutated sources"), ("dump", "mutated dumps"),
            ("config", "mutated configs"), ("artifact", "mutated artifacts"),
            ("args", "command lines"))
VALID_COLS = ("tried", "ok", "clean", "invariant: block-overlap", "invariant: loads-on-meta",
              "invariant: reads back", "invariant: other")


def report(result: dict[str, Any], args: argparse.Namespace) -> str:
    t: Tally = result["tally"]
    out = []
    out.append(f"kvspec fuzz: seed {args.seed}, {args.jobs} jobs, per-case limit "
               f"{args.time_limit:g} s, memory limit {args.memory_limit} MiB/worker")
    out.append(
        f"code: {_git('rev-parse', '--short', 'HEAD')}"
        f"{' + uncommitted changes in kvspec/' if _git('status', '--short', 'kvspec') else ''}"
    )
    out.append(f"run time: {result['run_time']:.0f} s (" + ", ".join(
        f"{k} {v:.0f} s" for k, v in result["phase_time"].items()) + ")")
    out.append("")
    out.append(f"{'':18}{'tried':>8}{'compiled':>10}{'clean err':>11}{'defects':>9}"
               f"{'messages':>10}{'no l:c':>8}{'no hint':>13}")
    for kind, label in _MUTATED:
        c = t.counts[kind]
        if c["tried"]:
            out.append(f"{label:18}{c['tried']:>8}{c['ok']:>10}{c['clean']:>11}{c['defect']:>9}"
                       f"{c['messages']:>10}{c['no_pos']:>8}{c['no_hint']:>13}")
    for kind, label in _MUTATED:
        if t.defects[kind]:
            out.append(f"  {label}, cases per defect category:")
            for cat, n in sorted(t.defects[kind].items(), key=lambda x: (-x[1], x[0])):
                out.append(f"    {n:>7}  {cat}")
    c = t.counts["valid"]
    if c["tried"]:
        out.append("")
        out.append("generated valid sources (compiled: block-id overlap at several block "
                   "counts, every invariant, read back, load on meta at min and larger)")
        head = (f"{'':10}{'tried':>7}{'compiled':>9}{'refused':>8}{'overlap':>8}{'load':>6}"
                f"{'readback':>9}{'other inv':>10}{'crash':>6}{'msg':>5}")
        out.append(head)
        rows = [(k, t.by_layout[k]) for k in g.AXIS_ORDERS] + [("all", _sum(t.by_layout))]
        rows += [(f, t.by_family[f]) for f in g.FAMILIES]
        for name, row in rows:
            crash = sum(v for k, v in row.items() if k in ("traceback", "timeout", "RecursionError",
                                                          "MemoryError", "crash (worker died)"))
            msg = sum(v for k, v in row.items() if k.startswith("message quality"))
            out.append(f"{name:10}{row['tried']:>7}{row['ok']:>9}{row['clean']:>8}"
                       f"{row['invariant: block-overlap']:>8}{row['invariant: loads-on-meta']:>6}"
                       f"{row['invariant: reads back']:>9}{row['invariant: other']:>10}"
                       f"{crash:>6}{msg:>5}")
            if name == "all":
                out.append("")
        out.append("  (refused: clean KvspecError; msg: refusals whose message is below the "
                   "bar; a case may count in several columns)")
    c = t.counts["vllm"]
    if c["tried"]:
        out.append("")
        out.append("generated sources against vLLM 0.33.0 (kvspec verify --against vllm)")
        out.append(f"{'':10}{'tried':>7}{'compiled':>9}{'agree':>7}{'by design':>10}"
                   f"{'unexplained':>12}{'failed':>7}")
        d = t.defects["vllm"]
        compiled = c["tried"] - c["clean"]
        out.append(f"{'all':10}{c['tried']:>7}{compiled:>9}{c['agree']:>7}"
                   f"{c['by design only']:>10}{d['unexplained difference']:>12}"
                   f"{c['defect'] - d['unexplained difference']:>7}")
        out.append("  (by design: every difference is one docs/vllm.md's table explains; "
                   "failed: the command did not run to a verdict)")
    out.append("")
    if t.slow:
        out.append(f"over {args.time_limit:g} s while every core was busy, in time when run "
                   f"again alone (not counted as defects): {len(t.slow)}")
        for kind, i, took, meta in sorted(t.slow, key=lambda x: -x[2]):
            out.append(f"  {kind} case {i}: {took:.1f} s alone; {meta}")
        out.append("")
    classes = sorted(t.classes.items(), key=lambda x: (x[1]["kind"], -x[1]["count"]))
    out.append(f"defect classes: {len(classes)} (reproducers in {args.out})")
    out.append("  [kind] occurrences (messages or exceptions)  class")
    for _, e in classes:
        out.append(f"  [{e['kind']}] {e['count']:>6}  {e['signature']}")
    return "\n".join(out)


def _sum(tables: dict[str, Counter]) -> Counter:
    total: Counter = Counter()
    for c in tables.values():
        total.update(c)
    return total


def _git(*a: str) -> str:
    try:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True,
                              timeout=20, check=False).stdout.strip()
    except Exception:  # noqa: BLE001
        return ""


def save(result: dict[str, Any], args: argparse.Namespace, text: str) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t: Tally = result["tally"]
    index = []
    for sig, e in sorted(t.classes.items(), key=lambda x: (x[1]["kind"], -x[1]["count"])):
        data = result["reproducers"].get(sig)
        if data is None:
            continue
        slug = re.sub(r"[^a-z0-9]+", "-", e["signature"].split(" | ")[0].lower()).strip("-")
        digest = hashlib.sha1(sig.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        ext = {"dump": ".json", "config": ".json", "artifact": ".kvlayout.json",
               "args": ".args"}.get(e["kind"], ".yaml")
        path = out / f"{e['kind']}-{slug}-{digest}{ext}"
        path.write_bytes(data)
        how = {"source": f"kvspec validate {path}", "dump": f"kvspec import {path}",
               "config": "kvspec " + " ".join(g.init_args(str(path), data)),
               "artifact": f"kvspec explain {path}; python -c \"import kvspec; "
                           f"kvspec.artifact.Artifact.read('{path}')\"",
               "args": "kvspec " + shlex.join(data.decode("utf-8", "surrogatepass").split(
                   "\0")) + " (in a directory holding tests/fuzz/generators.py's CLI_FILES)",
               "vllm": f"kvspec verify {path} --against vllm (in the vLLM venv)",
               "valid": f"python -c \"import kvspec; a = kvspec.compile('{path}'); "
                        "from tests.invariants import check_artifact; "
                        "print(check_artifact(a)); kvspec.load(a, device='meta', "
                        "num_blocks=a.min_num_blocks())\""}[e["kind"]]
        index.append(f"{path.name}\n  class: {e['signature']}\n  found: {e['count']} times\n"
                     f"  first: {e['kind']} case {e['first']} (--seed {args.seed}), "
                     f"{len(data)} bytes minimised from {len(e['raw'])}\n"
                     f"  what: {e['meta']}\n  detail: {e['detail']}\n  run: {how}\n")
    (out / "README.txt").write_text(text + "\n\nreproducers\n\n" + "\n".join(index),
                                    encoding="utf-8", errors="backslashreplace")
    summary = {"args": vars(args), "run_time_s": result["run_time"],
               "counts": {k: dict(v) for k, v in t.counts.items()},
               "defect_categories": {k: dict(v) for k, v in t.defects.items()},
               "valid_by_layout": {k: dict(v) for k, v in t.by_layout.items()},
               "valid_by_family": {k: dict(v) for k, v in t.by_family.items()},
               "classes": {s: {"kind": e["kind"], "count": e["count"], "first": e["first"],
                               "detail": e["detail"]} for s, e in t.classes.items()}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str,
                                                 ensure_ascii=True), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sources", type=int, default=20000, help="mutated sources")
    p.add_argument("--dumps", type=int, default=5000, help="mutated dumps")
    p.add_argument("--configs", type=int, default=5000,
                   help="mutated Hugging Face configs (kvspec init)")
    p.add_argument("--artifacts", type=int, default=5000,
                   help="mutated artifacts (kvspec explain, and the two readers compared)")
    p.add_argument("--args", type=int, default=5000, help="command lines")
    p.add_argument("--valid", type=int, default=12000, help="generated valid sources")
    p.add_argument("--against-vllm", type=int, default=0, metavar="N",
                   help="generated sources checked with verify --against vllm (needs vLLM)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", default="/tmp/kvspec-fuzz", help="where reproducers go")
    p.add_argument("--time-limit", type=float, default=10.0, help="seconds per case")
    p.add_argument("--memory-limit", type=int, default=4096,
                   help="MiB of address space a worker may add")
    p.add_argument("--minimise-budget", type=float, default=600.0,
                   help="seconds for minimising reproducers after the run")
    p.add_argument("--progress", type=int, default=2000, help="report every N cases")
    args = p.parse_args(argv)
    os.chdir(ROOT)
    if args.against_vllm and importlib.util.find_spec("vllm") is None:
        print("vLLM is not importable here: --against-vllm skipped (run this with the vLLM "
              "venv's python, see docs/vllm.md)", file=sys.stderr)
        args.against_vllm = 0
    result = run(args)
    text = report(result, args)
    save(result, args, text)
    print(text)
    t: Tally = result["tally"]
    return 1 if any(c["defect"] for c in t.counts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
