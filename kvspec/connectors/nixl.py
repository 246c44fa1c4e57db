"""Executing a :class:`~kvspec.connectors.plan.TransferPlan` between NIXL agents.

An optional extra (``pip install 'kvspec[nixl]'``, ``nixl==1.5.1``): NIXL and NumPy are
imported only when an endpoint is made, so importing kvspec never needs them.

A :class:`NixlEndpoint` is one rank of one deployment: a NIXL agent with that rank's
regions (pools) registered. Endpoints exchange :meth:`~NixlEndpoint.metadata` over any
channel (a pipe, a socket, a key-value store): it holds the NIXL agent's metadata and,
beside it, the endpoint's identity digest, rank and regions (name, base, length), so a
peer checks a plan against the caches it was made for before any byte moves.

Transfers are one-sided: :meth:`~NixlEndpoint.read` pulls on the destination (``READ``,
as vLLM's decode side does: it knows which blocks it allocated, and the source keeps its
blocks only until notified); :meth:`~NixlEndpoint.write` pushes from the source. Each
route's descriptors for every block of its pool are prepared once per peer
(``prep_xfer_dlist``, row ``block * runs + run``); a transfer picks rows
(``make_prepped_xfer``), posts, and waits until done or the timeout. On one host UCX
uses ``tcp`` on the loopback and ``cma``; ``UCX_TLS`` chooses other transports.
"""

# one idea: the endpoint of one rank (register, exchange, prepare, post, wait) is one
# object whose steps share its agent's state.

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvspec.connectors.plan import PlanMismatchError, Route, TransferPlan
from kvspec.errors import KvspecError

_MAGIC = b"kvspec-nixl/1\n"
_INSTALL_HINT = "install the extra: pip install 'kvspec[nixl]' (nixl==1.5.1)"
_PEER_HINT = ("check that the peer process is alive and that its metadata is current; "
              "give a longer timeout= for large transfers (UCX_TLS chooses the transport)")


class NixlError(KvspecError):
    """NIXL is missing, or a transfer through it failed."""


class NixlUnavailableError(NixlError):
    """The NIXL wheel is not installed or cannot load here."""


class PeerError(NixlError):
    """A remote agent is unknown, cannot be reached or did not finish in time."""


class TransferError(NixlError):
    """NIXL reported a transfer as failed."""


@dataclass(frozen=True, slots=True)
class Memory:
    """One registered region: base address, bytes, device id, NIXL memory kind."""

    addr: int
    length: int
    device: int = 0
    kind: str = "DRAM"

    @classmethod
    def of(cls, region: Any, name: str) -> Memory:
        """From a contiguous tensor, a :class:`Memory`, or a host ``(addr, length, device)``."""
        if isinstance(region, Memory):
            return region
        if hasattr(region, "data_ptr"):
            if not region.is_contiguous():
                raise NixlError(f"region {name!r} is not a contiguous tensor",
                                hint="register the pool's buffer, not a view of it")
            dev = region.device
            return cls(region.data_ptr(), region.numel() * region.element_size(),
                       dev.index or 0 if dev.type != "cpu" else 0,
                       "DRAM" if dev.type == "cpu" else "VRAM")
        try:
            addr, length, device = region
            return cls(int(addr), int(length), int(device))
        except (TypeError, ValueError):
            raise NixlError(f"region {name!r} is not a tensor, a Memory or an (addr, length, "
                            f"device) triple: {region!r}", hint="register each pool's buffer"
                            ) from None


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """What a peer's metadata says: its agent, identity digest, rank and regions."""

    agent: str
    digest: str
    rank: int
    regions: Mapping[str, Memory]


@dataclass(frozen=True, slots=True)
class TransferStats:
    """One transfer: bytes and descriptors posted; seconds preparing lists (0 when done
    before), posting (``make_prepped_xfer``, ``transfer``), and from post until done."""

    bytes: int
    descriptors: int
    prepare_seconds: float
    post_seconds: float
    transfer_seconds: float


def _nixl() -> Any:
    """The ``nixl._api`` module; NIXL is heavy (UCX and its plugins), so imported here."""
    try:
        import nixl._api as api  # deferred: NIXL is an optional extra
    except Exception as exc:  # ImportError, or OSError from a shared library
        raise NixlUnavailableError(f"NIXL cannot load: {exc}", hint=_INSTALL_HINT) from exc
    if not os.environ.get("NIXL_LOG_LEVEL"):
        logging.getLogger("nixl").setLevel(logging.WARNING)  # quiet its INFO lines
    return api


class NixlEndpoint:
    """One rank's regions registered with its own NIXL agent.

    ``regions`` maps region names (a plan's ``Region.name``, e.g. the pools of
    ``LoadedCache.buffers``) to tensors, triples or :class:`Memory`; ``digest`` is the
    identity digest of the cache they hold, ``rank`` its rank in its deployment.
    """

    def __init__(self, regions: Mapping[str, Any], *, digest: str, rank: int = 0,
                 name: str | None = None, backends: tuple[str, ...] = ("UCX",)) -> None:
        api = _nixl()
        import numpy as np  # deferred: NIXL needs NumPy, kvspec's compiler never does

        self._np = np
        self.name = name or f"kvspec-r{rank}-{uuid.uuid4().hex[:12]}"
        self.digest, self.rank = digest, rank
        self.regions = {k: Memory.of(v, k) for k, v in regions.items()}
        try:
            self.agent = api.nixl_agent(self.name, api.nixl_agent_config(
                backends=list(backends)))
        except Exception as exc:
            raise NixlUnavailableError(f"NIXL could not start agent {self.name!r}: {exc}",
                                       hint=_INSTALL_HINT) from exc
        self._registered = [self.agent.register_memory(
            [(m.addr, m.length, m.device, k) for k, m in self.regions.items() if m.kind == kind],
            kind) for kind in sorted({m.kind for m in self.regions.values()})]
        self._peers: dict[tuple[str, int], PeerInfo] = {}  # by (digest, rank)
        self._prepped: dict[tuple, tuple[Any, Any, int]] = {}  # (local, remote, runs)

    @classmethod
    def for_cache(cls, cache: Any, *, rank: int | None = None, name: str | None = None,
                  backends: tuple[str, ...] = ("UCX",)) -> NixlEndpoint:
        """An endpoint for a :class:`~kvspec.runtime.loader.LoadedCache`: its regions (the
        allocations its descriptor lists) and identity digest, as rank ``rank`` of its
        deployment (default: the cache's own)."""
        desc = cache.descriptor(rank)
        regions = {r.name: cache.buffers[r.name] for r in desc.regions}
        return cls(regions, digest=desc.identity, rank=desc.parallel.rank, name=name,
                   backends=backends)

    # -- metadata ----------------------------------------------------------------
    def metadata(self) -> bytes:
        """For a peer's :meth:`add_peer`: ``_MAGIC``, an 8-byte header length, the header
        (JSON: agent, digest, rank, regions), then the NIXL agent's own metadata."""
        head = json.dumps({"agent": self.name, "digest": self.digest, "rank": self.rank,
                           "regions": {k: [m.addr, m.length, m.device, m.kind]
                                       for k, m in self.regions.items()}}).encode()
        return _MAGIC + struct.pack(">Q", len(head)) + head + self.agent.get_agent_metadata()

    def add_peer(self, metadata: bytes) -> PeerInfo:
        """Load a peer's :meth:`metadata`; it replaces an earlier peer of the same
        digest and rank (a restarted process)."""
        try:
            if not metadata.startswith(_MAGIC):
                raise ValueError("it is not a kvspec NIXL endpoint's metadata")
            (size,) = struct.unpack_from(">Q", metadata, len(_MAGIC))
            start = len(_MAGIC) + 8
            head = json.loads(metadata[start:start + size])
            peer = PeerInfo(head["agent"], head["digest"], head["rank"],
                            {k: Memory(*v) for k, v in head["regions"].items()})
            old = self._peers.get((peer.digest, peer.rank))
            if old is not None:
                self._forget(old)
            self.agent.add_remote_agent(metadata[start + size:])
            self.agent.make_connection(peer.agent)
        except Exception as exc:
            raise PeerError(f"cannot load a peer's metadata: {exc}", hint="pass the bytes "
                            "the peer's NixlEndpoint.metadata() returned, unchanged") from exc
        self._peers[(peer.digest, peer.rank)] = peer
        return peer

    # -- transfers ---------------------------------------------------------------
    def read(self, plan: TransferPlan, blocks: Any, *, timeout: float = 30.0,
             notify: bytes = b"") -> TransferStats:
        """Pull ``blocks`` (as :meth:`TransferPlan.units` takes them) into this
        destination rank, then send ``notify`` to each source."""
        return self._execute(plan, blocks, "READ", timeout, notify)

    def write(self, plan: TransferPlan, blocks: Any, *, timeout: float = 30.0,
              notify: bytes = b"") -> TransferStats:
        """Push ``blocks`` from this source rank to the destination ranks; then send
        ``notify`` to each destination."""
        return self._execute(plan, blocks, "WRITE", timeout, notify)

    def prepare(self, plan: TransferPlan, op: str = "READ") -> float:
        """Prepare this rank's descriptor lists for ``plan`` now (else the first
        transfer does); the seconds it took."""
        start = time.perf_counter()
        for route in self._routes(plan, op, plan.groups()):
            self._lists(plan, route, self._peer(plan, route, op), op)
        return time.perf_counter() - start

    def wait_notification(self, peer: str, message: bytes, *, timeout: float = 30.0) -> None:
        """Wait until agent ``peer`` sends ``message`` (e.g. a reader's ``notify``)."""
        deadline = time.monotonic() + timeout
        while not self.agent.check_remote_xfer_done(peer, message, tag_is_prefix=False):
            if time.monotonic() > deadline:
                raise PeerError(f"no notification {message!r} from NIXL agent {peer!r} "
                                f"within {timeout:g} s", hint=_PEER_HINT)
            time.sleep(0.0005)

    def _execute(self, plan: TransferPlan, blocks: Any, op: str, timeout: float,
                 notify: bytes) -> TransferStats:
        np = self._np
        routes = self._routes(plan, op, plan.groups())   # every check before any byte moves:
        peers = [self._peer(plan, route, op) for route in routes]  # digests and regions,
        pairs = plan.units(blocks)                                  # then block ids
        jobs = [(r, p) for r, p in zip(routes, peers, strict=True) if pairs.get(r.group)]
        start = time.perf_counter()
        lists = [self._lists(plan, r, p, op) for r, p in jobs]
        posted, nbytes, count = [], 0, 0
        prepared = time.perf_counter()
        try:
            for (route, peer), (local, remote, runs) in zip(jobs, lists, strict=True):
                ids = np.asarray(pairs[route.group], dtype=np.int64).reshape(-1, 4)
                src = ids[:, 0] * route.src_sub_blocks + ids[:, 1]   # unit indices
                dst = ids[:, 2] * route.dst_sub_blocks + ids[:, 3]
                mine, theirs = (dst, src) if op == "READ" else (src, dst)
                step = np.arange(runs, dtype=np.int64)
                li = (mine[:, None] * runs + step).ravel().astype(np.int32)
                ri = (theirs[:, None] * runs + step).ravel().astype(np.int32)
                posted.append((peer.agent, self._post(op, local, li, remote, ri, peer)))
                nbytes += route.bytes_per_block * len(ids)
                count += li.size
        except NixlError:
            _release(h for _, h in posted)
            raise
        posting = time.perf_counter()
        self._wait(posted, timeout)
        moved = time.perf_counter()
        for agent in dict.fromkeys(a for a, _ in posted) if notify else ():
            self.agent.send_notif(agent, notify)
        return TransferStats(nbytes, count, prepared - start, posting - prepared,
                             moved - prepared)

    def _routes(self, plan: TransferPlan, op: str, groups: tuple[str, ...]) -> list[Route]:
        if op not in ("READ", "WRITE"):
            raise NixlError(f"unknown NIXL operation {op!r}", expected="READ or WRITE",
                            hint="READ on the destination, WRITE on the source")
        mine = plan.destination if op == "READ" else plan.source
        _fits(mine, self.rank, self.digest, self.regions, "this endpoint")
        return [r for r in plan.routes if r.group in groups and r.runs and
                (r.dst_rank if op == "READ" else r.src_rank) == self.rank]

    def _peer(self, plan: TransferPlan, route: Route, op: str) -> PeerInfo:
        side, rank = (plan.source, route.src_rank) if op == "READ" else (
            plan.destination, route.dst_rank)
        peer = self._peers.get((side.digest, rank))
        if peer is None:
            others = [p for p in self._peers.values() if p.rank == rank]
            if others:
                _fits(side, rank, others[-1].digest, others[-1].regions,
                      f"peer {others[-1].agent!r}")
            raise PeerError(f"no peer for rank {rank} of the plan's "
                            f"{'source' if op == 'READ' else 'destination'} ({side.digest})",
                            hint="add_peer() with that rank's metadata first")
        _fits(side, rank, peer.digest, peer.regions, f"peer {peer.agent!r}")
        return peer

    def _lists(self, plan: TransferPlan, route: Route, peer: PeerInfo, op: str) -> tuple:
        """The prepared local and remote descriptor lists of ``route`` with ``peer``:
        ``(units * runs, 3)`` rows ``(addr, length, device)``, row ``unit * runs + run``
        (``unit = block * sub_blocks + i``)."""
        key = (peer.agent, op, route, plan.source.num_blocks[route.group],
               plan.destination.num_blocks[route.group])
        if key not in self._prepped:
            src = self.regions if op == "WRITE" else peer.regions
            dst = self.regions if op == "READ" else peer.regions
            ends = [(plan.source, route.src_rank, src, route.src_sub_blocks,
                     [(r.src_region, r.src_offset, r.src_stride, r.src_sub_stride)
                      for r in route.runs]),
                    (plan.destination, route.dst_rank, dst, route.dst_sub_blocks,
                     [(r.dst_region, r.dst_offset, r.dst_stride, r.dst_sub_stride)
                      for r in route.runs])]
            if op == "READ":
                ends.reverse()  # the local list first: the destination's
            lengths = [r.length for r in route.runs]
            made = [self._prep("" if i == 0 else peer.agent,
                               _descriptors(self._np, side, rank, regions, runs, lengths,
                                            side.num_blocks[route.group], sub))
                    for i, (side, rank, regions, sub, runs) in enumerate(ends)]
            self._prepped[key] = (made[0], made[1], len(route.runs))
        return self._prepped[key]

    def _prep(self, agent: str, descs: tuple[Any, str]) -> Any:
        rows, kind = descs
        try:
            return self.agent.prep_xfer_dlist(agent, rows, kind)
        except Exception as exc:
            raise PeerError(f"NIXL cannot prepare descriptors of agent "
                            f"{agent or self.name!r}: {exc}", hint=_PEER_HINT) from exc

    def _post(self, op: str, local: Any, li: Any, remote: Any, ri: Any, peer: PeerInfo) -> Any:
        try:
            handle = self.agent.make_prepped_xfer(op, local, li, remote, ri)
            if self.agent.transfer(handle) == "ERR":
                raise TransferError(f"NIXL failed to post a {op} with agent {peer.agent!r}",
                                    hint=_PEER_HINT)
        except NixlError:
            raise
        except Exception as exc:
            raise PeerError(f"NIXL agent {peer.agent!r} (rank {peer.rank}) cannot be "
                            f"reached: {exc}", hint=_PEER_HINT) from exc
        return handle

    def _wait(self, posted: list[tuple[str, Any]], timeout: float) -> None:
        deadline, pending, spins = time.monotonic() + timeout, list(posted), 0
        while pending:
            state = [(a, h, self.agent.check_xfer_state(h)) for a, h in pending]
            failed = [a for a, _, s in state if s == "ERR"]
            if failed:
                _release(h for _, h in pending)
                raise TransferError(f"NIXL reported a failed transfer with agent "
                                    f"{failed[0]!r}", hint=_PEER_HINT)
            for _, h, s in state:
                if s == "DONE":
                    h.release()
            pending = [(a, h) for a, h, s in state if s != "DONE"]
            if pending and time.monotonic() > deadline:
                _release(h for _, h in pending)
                names = ", ".join(sorted({repr(a) for a, _ in pending}))
                raise PeerError(f"NIXL agent {names} did not answer within {timeout:g} s "
                                f"({len(pending)} of {len(posted)} transfers unfinished)",
                                hint=_PEER_HINT)
            spins += 1
            time.sleep(0 if spins < 64 else 0.0002)

    # -- lifetime ----------------------------------------------------------------
    def _forget(self, peer: PeerInfo) -> None:
        for key in [k for k in self._prepped if k[0] == peer.agent]:
            local, remote, _ = self._prepped.pop(key)
            _release((local, remote))
        self.agent.remove_remote_agent(peer.agent)

    def close(self) -> None:
        """Release prepared lists, forget peers and deregister the regions."""
        for peer in list(self._peers.values()):
            self._forget(peer)
        self._peers.clear()
        while self._registered:
            self.agent.deregister_memory(self._registered.pop())

    def __enter__(self) -> NixlEndpoint:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _fits(side: Any, rank: int, digest: str, regions: Mapping[str, Memory], who: str) -> None:
    """Raise a :class:`PlanMismatchError` unless ``side``'s rank ``rank`` is the cache
    ``who`` holds: the same identity digest, and each region registered at its length."""
    if digest != side.digest:
        raise PlanMismatchError(f"the plan was made for {side.digest}, and {who} (rank "
                                f"{rank}) holds {digest}", expected=side.digest, found=digest,
                                hint="make the plan from the artifacts these caches were "
                                     "loaded from (`kvspec transfer SRC DST`)")
    for region in side.regions_of(rank):
        have = regions.get(region.name)
        if have is None or have.length != region.length:
            raise PlanMismatchError(
                f"the plan's region {region.name!r} of rank {rank} is {region.length} B, and "
                f"{who} registered {'none' if have is None else f'{have.length} B'}",
                expected=str(region.length), found=None if have is None else str(have.length),
                hint="load both caches with the block counts the plan was made for")


def _descriptors(np: Any, side: Any, rank: int, regions: Mapping[str, Memory],
                 runs: list[tuple[int, int, int, int]], lengths: list[int],
                 count: int, sub: int) -> tuple[Any, str]:
    """``(count * sub * len(runs), 3)`` rows ``(addr, length, device)`` for every unit of
    every block of the pool (``sub`` units a block), unit-major, and the regions' one
    memory kind."""
    mems = [regions[side.region(rank, region).name] for region, _, _, _ in runs]
    kinds = {m.kind for m in mems}
    if len(kinds) != 1 or len({m.device for m in mems}) > 1:
        raise NixlError("a route's runs span memory kinds or devices",
                        hint="split the route per pool: one NIXL list holds one kind")
    base = np.array([m.addr + off for m, (_, off, _, _) in zip(mems, runs, strict=True)],
                    dtype=np.uint64)
    stride = np.array([s for _, _, s, _ in runs], dtype=np.uint64)
    step = np.array([s for _, _, _, s in runs], dtype=np.uint64)
    unit = np.arange(count * sub, dtype=np.uint64)
    rows = np.empty((count * sub, len(runs), 3), dtype=np.uint64)
    rows[:, :, 0] = base + (unit // sub)[:, None] * stride + (unit % sub)[:, None] * step
    rows[:, :, 1] = np.array(lengths, dtype=np.uint64)
    rows[:, :, 2] = mems[0].device  # (units, runs, 3)
    return rows.reshape(-1, 3), kinds.pop()


def _release(handles: Any) -> None:
    """Release NIXL handles; one still in flight may refuse (its agent frees it)."""
    for handle in handles:
        # an in-flight transfer NIXL cannot cancel; NIXL's errors share no base class
        with contextlib.suppress(Exception):
            handle.release()
