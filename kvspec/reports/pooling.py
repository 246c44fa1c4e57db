"""The pooling policy in the terminal: a separate plan's pools, and the candidates a
policy weighed with what each buys at the workload.

>>> from kvspec.artifact.format import Candidate
>>> c = Candidate(name="unified", policy="unified", block_size=16, groups=1,
...               static_requests=2.5, workload_requests=150.0, physical_limit=160.0,
...               simulated=None, tokens_held=None, waste=None, binding_pool="device",
...               note=None, curve=[])
>>> print(candidates_table([c], chosen=0))
   candidate  block  groups  at max_model_len  at workload  simulated mean / peak  waiting: memory / seqs / tokens  util. memory  layout waste  limit at avg. request
-  ---------  -----  ------  ----------------  -----------  ---------------------  -------------------------------  ------------  ------------  ---------------------
*  unified       16       1             2.50x        150.0                      -                                -             -             -                  160.0
"""  # noqa: E501 (the doctest's expected table is wider than a line)

from __future__ import annotations

from collections.abc import Sequence

from kvspec.artifact.format import Candidate, PoolingRecord, Simulated, Waste
from kvspec.reports.format import count, human_bytes, table

__all__ = ["LIMIT", "cap_lines", "candidates_table", "compact_table", "live_share",
           "pooling_lines", "pools_table", "utilization", "waiting_cell", "waste_line"]

#: What the physical limit is, wherever it is shown: it is priced at the workload's
#: average request, so the simulated peak (of shorter requests) may pass it.
LIMIT = ("limit at avg. request: requests of the average size whose live tokens and states "
         "alone fill the budget;\n  the simulated peak, of shorter requests, may pass it")


def _num(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def waiting_cell(sim: Simulated | None) -> str:
    """Steps where requests wait, by reason: ``memory / max_num_seqs / token budget``."""
    by = None if sim is None else sim.waiting_steps_by_reason
    if by is None:
        return "-"
    return f"{by.memory:,} / {by.max_num_seqs:,} / {by.max_num_batched_tokens:,}"


def candidates_table(candidates: Sequence[Candidate], chosen: int | None) -> str:
    """One line per candidate: static requests at max_model_len and at the
    workload, the simulation's mean and peak running requests, the steps where
    requests wait by what they wait for, the utilisation and the layout's waste
    while memory binds, and the physical limit; ``*`` marks the one kept."""
    rows = []
    for i, c in enumerate(candidates):
        sim = c.simulated
        running = "-" if sim is None else f"{sim.mean_running:.1f} / {sim.peak_running}"
        rows.append(["*" if i == chosen else "", c.name + (f" ({c.note})" if c.note else ""),
                     c.block_size, c.groups,
                     "-" if c.static_requests is None else f"{c.static_requests:.2f}x",
                     _num(c.workload_requests), running, waiting_cell(sim),
                     _num(utilization(c), ".3f"),
                     _num(None if sim is None else sim.layout_waste, ".1%"),
                     _num(c.physical_limit)])
    return table(rows, ["", "candidate", "block", "groups", "at max_model_len", "at workload",
                        "simulated mean / peak", "waiting: memory / seqs / tokens",
                        "util. memory", "layout waste", "limit at avg. request"],
                 "llrrrrrrrrr")


#: The columns of :func:`compact_rows` ("util.": live bytes while memory binds; "limit":
#: the physical limit at the average request, :data:`LIMIT`, as the legend above the
#: table says: 80 columns hold no more).
COMPACT = ("", "candidate", "max_len", "workload", "simulated", "util.", "limit")


def compact_rows(candidates: Sequence[Candidate], chosen: int | None
                 ) -> tuple[list[list[str]], list[str]]:
    """The candidates' figures as text cells (:data:`COMPACT`), and the notes the
    rows' numbered footnotes refer to."""
    rows, notes = [], []
    for i, c in enumerate(candidates):
        sim = c.simulated
        name = c.name
        if c.note:
            notes.append(c.note)
            name += f" ({len(notes)})"
        rows.append(["*" if i == chosen else "", name,
                     "-" if c.static_requests is None else f"{c.static_requests:.1f}",
                     _num(c.workload_requests),
                     "-" if sim is None else f"{sim.mean_running:.1f}/{sim.peak_running}",
                     _num(utilization(c), ".2f"),
                     _num(c.physical_limit)])
    return rows, notes


def compact_table(candidates: Sequence[Candidate], chosen: int | None) -> str:
    """:func:`candidates_table` within 80 columns (``explain``): requests at
    max_model_len and at the workload, simulated mean and peak, utilisation while
    memory binds, physical limit; a candidate's note as a numbered footnote."""
    rows, notes = compact_rows(candidates, chosen)
    out = table(rows, list(COMPACT), "llrrrrr")
    return "\n".join([out, *(f"({i}) {n}" for i, n in enumerate(notes, start=1))])


def pools_table(record: PoolingRecord) -> str:
    """A separate plan's pools: share, blocks, bytes, requests at max_model_len."""
    rows = []
    for p in record.pools:
        b = p.budget
        rows.append([p.name, f"{p.share[0] / p.share[1]:.1%}",
                     "state slots" if p.state else "tokens",
                     "-" if b is None else f"{b.num_blocks:,}",
                     "-" if b is None else human_bytes(b.memory),
                     "-" if b is None or b.max_concurrency is None
                     else f"{b.max_concurrency:.2f}x"])
    return table(rows, ["pool", "share", "holds", "blocks", "memory", "at max_model_len"])


def pooling_lines(record: PoolingRecord) -> list[str]:
    """What ``compile`` and ``plan`` print of the policy's decision."""
    out = [f"pooling: {record.policy} (asked {record.asked}, served by {record.serve_with})"]
    if record.pools:
        out.append(pools_table(record))
    w = record.workload
    if w is not None:
        source = f"trace {w.trace}" if w.trace else (
            f"{count(w.requests, 'request')}, prompts ~{w.context_tokens:,.0f} tokens, outputs "
            f"~{w.output_tokens:,.0f}")
        out.append(f"workload: {source}; a running request holds {w.held_tokens:,} tokens "
                   "on average")
        if record.pools and record.chosen is not None:
            out.append(_binding(record.candidates[record.chosen], w.held_tokens))
    if record.candidates:
        out.append("requests each candidate holds (static: the engine's accounting; "
                   "simulated: the trace replayed):")
        out.append(candidates_table(record.candidates, record.chosen))
        out += _legend(record)
        if record.chosen is not None:
            out += cap_lines(record.candidates[record.chosen])
    return out


def cap_lines(c: Candidate) -> list[str]:
    """When the request cap, not memory, keeps the kept plan's requests waiting most:
    say so, name the flag, and the requests at which memory would bind."""
    sim = c.simulated
    by = None if sim is None else sim.waiting_steps_by_reason
    if sim is None or by is None or by.max_num_seqs <= by.memory:
        return []
    at = c.workload_requests
    where = "" if at is None else (f"; memory would bind at about {at:,.0f} running requests "
                                   "(its blocks at the workload's held tokens)")
    return [f"the request cap binds, not memory: max_num_seqs ({sim.peak_running:,} running) "
            f"keeps requests waiting in {by.max_num_seqs:,} steps, memory in {by.memory:,}"
            + where,
            "  the candidates' capacity is the cap's, not the layout's: raise max_num_seqs "
            "(engine.max_num_seqs, vLLM's --max-num-seqs)"
            + ("" if at is None else f" above {at:,.0f}") + " to compare the layouts"]


def _binding(c: Candidate, held: int) -> str:
    """Which pool runs out first at the workload, and the static requests at half and
    one and a half times its context."""
    at = dict(c.curve)
    near = {m: min(at, key=lambda t: abs(t - held * m)) for m in (0.5, 1.5)} if at else {}
    moves = ", ".join(f"{at[t]:.1f} at {t:,} tokens" for t in near.values())
    line = f"runs out first at the workload: pool {c.binding_pool}"
    return line + (f"; static requests at -50% / +50% context: {moves}" if moves else "")


def utilization(c: Candidate) -> float | None:
    """A candidate's share of the pools holding live bytes while memory keeps requests
    waiting: from its waste breakdown (measured over those steps) when it has one
    (:func:`live_share`), so every figure of it printed agrees, else the simulator's own."""
    if c.waste is not None and c.waste.pool_bytes:
        return live_share(c.waste)
    return None if c.simulated is None else c.simulated.utilization_while_memory_bound


def live_share(w: Waste) -> float | None:
    """The share of the pools holding live tokens and states while memory binds: what
    the waste kinds leave of them (one figure for ``compile``, ``plan`` and ``explain``,
    so their shares add up to the pools' bytes)."""
    if not w.pool_bytes:
        return None
    wasted = w.padding_slots + w.padded_pages + w.block_inflation + w.per_request + w.idle
    return max(w.pool_bytes - wasted, 0) / w.pool_bytes


def waste_line(w: Waste) -> str:
    """Where the pool's bytes go while memory binds, as shares of them."""
    def share(x: int) -> str:
        return f"{x / w.pool_bytes:.1%}" if w.pool_bytes else "-"
    return (f"padding slots {share(w.padding_slots)}, padded pages {share(w.padded_pages)}, "
            f"block inflation {share(w.block_inflation)},\n  per-request constants "
            f"{share(w.per_request)}, idle {share(w.idle)}")


def _legend(record: PoolingRecord) -> list[str]:
    """How to read the table, and where the kept plan's bytes go."""
    out = ["  at max_model_len: every request priced at max_model_len (vLLM's start-up figure)",
           "  at workload: priced at the tokens a running request holds on average",
           "  simulated: running requests while the trace is replayed through vLLM v1's scheduling",
           "  " + LIMIT]
    if record.chosen is None:
        return out
    c = record.candidates[record.chosen]
    out.append("  waiting: steps where requests wait, by what they wait for: memory, "
               "max_num_seqs, the token budget")
    out.append("  util. memory, layout waste: live bytes, and padding, inflation and "
               "per-request constants, while memory binds")
    if c.waste is not None and c.simulated is not None:
        used = _num(utilization(c), ".1%")
        out.append(f"kept: {c.name}; while memory keeps requests waiting, live tokens and "
                   f"states fill {used}")
        out.append(f"  of its pools; the rest: {waste_line(c.waste)}")
    return out
