"""A rank among the other ranks of a several-process run: that they were all started alike, and, when some stop
answering mid-run, which ranks are gone, on which node, after which step.

Before anything loads, the ranks agree (``agree``): each writes what it was started with (the resolved recipe, the
versions, its node's process count) into the rendezvous store described below and reads every other's; nodes started
differently are refused on every rank (exit 2), each difference named.

Every training step of a data-parallel run meets in collectives (DDP's gradient all-reduce, ft's agreement on a
stop). When a rank's process dies (SIGKILL, the kernel's OOM killer, its machine gone), its sockets close and the
collective fails at once on the ranks that talk to it (gloo: "Connection closed by peer"); when it hangs, or its
network goes without closing, the collective fails after the process group's timeout (``launch.collective_timeout``,
TrainingArguments' ``ddp_timeout``). Torch's error names an address, not a rank; and a survivor whose collective
involves only other survivors stays blocked in it until one of them exits. The launcher alone would say "the run
failed" on each machine.

So each rank beats (``beat``): a daemon thread adds 1 to its own counter in the rendezvous store every
``BEAT_SECONDS``, the store every rank of an elastic launch (``ft train``'s or torchrun's) reaches at
MASTER_ADDR:MASTER_PORT, served by node 0's launcher. A thread beats while its main thread is blocked in a collective;
a dead or frozen process does not. A survivor that fails takes a roll call (``roll_call``): the counters that did not
move over ``ROLL_CALL_SECONDS`` are the lost ranks, except those that left after their own roll call (they set a key
first), grouped by node (the elastic launcher numbers ranks node by node: node = rank // LOCAL_WORLD_SIZE). A store
that cannot be reached means node 0, which serves it, is gone. The paragraph names them, the step, the newest complete
checkpoint and the command to run on every node once they are back; the lowest surviving rank of each node says it
(the others one line), and each exits 1.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from dataclasses import dataclass

from ..errors import FtError
from ..recipe.errors import first_line
from . import ranks

BEAT_SECONDS = 1.0
ROLL_CALL_SECONDS = 5.0  # five beats: a thread the GIL or a loaded machine delays still beats within it
# what gloo and NCCL say when a peer is gone or silent (torch raises them as RuntimeError or DistBackendError)
_PEER_GONE = re.compile(r"Connection (closed|reset) by peer|Broken pipe|Timed out waiting|timed out|"
                        r"NCCL communicator was aborted|remote process exited|ProcessGroupNCCL|ProcessGroupGloo")
AGREE_SECONDS = 300  # how long a rank waits for every other rank's identity (all start together, after the rendezvous)


class NodesDiffer(FtError):
    """The nodes of one run were started differently (recipe, versions, processes per node): exit 2 on every rank,
    before anything loads."""


class PeerLost(FtError, exit_code=1):
    """Ranks of the run stopped answering mid-training: this rank ended too (exit 1), naming them."""


def peer_failure(exc: BaseException) -> bool:
    """True for a collective that failed because another rank is gone or silent (not a bug in this rank)."""
    import torch.distributed as dist

    return isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError) and bool(_PEER_GONE.search(str(exc))))


@dataclass(frozen=True)
class RollCall:
    """The roll call as this rank took it: ``lost`` are the ranks whose heartbeat stood still (None: the store could
    not be reached); ``per_node`` ranks on each node."""

    rank: int
    world: int
    per_node: int
    lost: tuple[int, ...] | None

    def survivors(self) -> list[int]:
        return [] if self.lost is None else [r for r in range(self.world) if r not in self.lost]

    def speaks(self) -> bool:
        """Whether this rank is the lowest survivor of its node (it says the paragraph; the others one line)."""
        node = self.rank // self.per_node
        return self.lost is None or min(r for r in self.survivors() if r // self.per_node == node) == self.rank

    def who(self) -> str:
        """"node 1 (ranks 2, 3)", "rank 2 (node 1)", or node 0 when the store it serves is gone."""
        if self.lost is None:
            return "node 0, which serves the rendezvous store (it cannot be reached),"
        parts = []
        for node in sorted({r // self.per_node for r in self.lost}):
            gone = [r for r in self.lost if r // self.per_node == node]
            listed = f"rank{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))}"
            parts.append(f"node {node} ({listed})" if len(gone) == self.per_node else f"{listed} (node {node})")
        return " and ".join(parts)


def _store(seconds: float):
    """A client of the rendezvous store (node 0's launcher serves it; every rank has its address)."""
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=timedelta(seconds=seconds), wait_for_workers=False)


def store_key(kind: str, rank: int) -> str:
    return f"ft/{kind}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{rank}"


def beat() -> None:
    """In one rank of several: start the daemon thread that adds 1 to this rank's counter in the rendezvous store every
    ``BEAT_SECONDS`` (a no-op with one process, or without a store to reach)."""
    import torch.distributed as dist

    if ranks.world_size() == 1 or "MASTER_ADDR" not in os.environ:
        return
    try:
        store = _store(30)
    except (KeyError, ValueError, RuntimeError, dist.DistError):
        return
    key = store_key("beat", ranks.rank())

    def beating() -> None:
        while True:
            try:
                store.add(key, 1)
            except (RuntimeError, dist.DistError):
                return  # the store is gone: node 0's roll call has nothing left to read
            time.sleep(BEAT_SECONDS)

    threading.Thread(target=beating, name="ft-heartbeat", daemon=True).start()


def roll_call(seconds: float = ROLL_CALL_SECONDS) -> RollCall:
    """The ranks whose heartbeat stood still for ``seconds`` and that did not leave after a roll call of their own;
    then this rank leaves (its key set). SIGTERM is ignored from here on: the launcher stops the ranks of a node once
    one has ended, and this one ends by itself, once it has said what happened."""
    import torch.distributed as dist

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank, world = ranks.rank(), ranks.world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    others = [r for r in range(world) if r != rank]
    try:
        store = _store(seconds)
        before = {r: store.add(store_key("beat", r), 0) for r in others}
        time.sleep(seconds)
        still = [r for r in others if store.add(store_key("beat", r), 0) == before[r]]
        lost = tuple(r for r in still if not store.check([store_key("left", r)]))
        store.set(store_key("left", rank), "1")
    except (KeyError, ValueError, RuntimeError, dist.DistError):
        return RollCall(rank, world, per_node, None)
    return RollCall(rank, world, per_node, lost)


def explain(exc: BaseException, call: RollCall, step: int, max_steps: int, timeout: int, checkpoint: str | None,
            command: str) -> PeerLost | None:
    """The paragraph for a collective that failed because ranks were lost (None when every rank answered the roll
    call: the failure is something else, and is raised as it is)."""
    if call.lost == ():
        return None
    if not call.speaks():
        return PeerLost(f"rank {call.rank} stopped: {call.who()} was lost after step {step} (the lowest rank of "
                        "this node says more).")
    where = (f"The newest complete checkpoint is {checkpoint}" if checkpoint
             else "No checkpoint was saved before it, so the run starts over")
    return PeerLost(
        f"{call.who()} was lost after step {step} of {max_steps}: its processes stopped answering (torch: "
        f"{first_line(exc)}); the ranks that answered ended too. {where}. Find what ended "
        "it (the node's own log; `dmesg` shows the kernel's OOM killer; a scheduler's preemption notice), then run the "
        f"same command on every node to go on: {command}. A rank that was only slow (a long checkpoint save) is taken "
        f"for lost after launch.collective_timeout ({timeout} s): raise it for such runs.")


def agree(recipe: dict, versions: dict) -> None:
    """In a rank of an elastic launch (``ft train``'s or torchrun's, which serve their store) on several processes:
    refuse (``NodesDiffer``, exit 2 on every rank, before anything loads) when the ranks were started with
    different recipes (``recipe``: the resolved recipe, --set applied, secrets redacted; its ``launch:`` may differ
    per node), different ``versions`` of Python, ft and the libraries, or a different number of processes per node.
    Each rank writes its identity to the rendezvous store and reads every other's: a rank that never writes one
    failed before, and says why itself."""
    import torch.distributed as dist

    world = ranks.world_size()
    if world == 1 or "MASTER_ADDR" not in os.environ or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return  # no launcher's store to meet in before the process group (rank 0 would serve it only from then on)
    rank = ranks.rank()
    mine = {"node": int(os.environ.get("GROUP_RANK", "0")), "processes per node": os.environ.get("LOCAL_WORLD_SIZE"),
            "versions": versions, "recipe": {key: value for key, value in recipe.items() if key != "launch"}}
    keys = [store_key("identity", r) for r in range(world)]
    try:
        store = _store(AGREE_SECONDS)
        store.set(keys[rank], json.dumps(mine, sort_keys=True, default=str))
        store.wait(keys)
        identities = [json.loads(store.get(key)) for key in keys]
    except (KeyError, ValueError, RuntimeError, dist.DistError):
        return  # a rank that never wrote its identity ended before: its own error says why
    by_node = {identity["node"]: identity for identity in reversed(identities)}  # each node's first rank
    differences = {node: _differences(by_node[0], identity) for node, identity in sorted(by_node.items()) if node}
    differences = {node: found for node, found in differences.items() if found}
    if not differences:
        return
    if os.environ.get("LOCAL_RANK", "0") != "0":
        raise NodesDiffer(f"rank {rank} refused the run too: its nodes were started differently (its node's first "
                          "rank says how).")
    said = "; ".join(f"node {node} differs from node 0 in " + ", ".join(found) for node, found in differences.items())
    raise NodesDiffer(
        f"launch: the nodes of this run were started differently, so they would train different things or wait in "
        f"collectives the others never enter: {said}. Start every node with the same recipe, --set flags and "
        "--num-processes, in the same environment (the same image: Python, ft and library versions); only "
        "--node-rank differs between them. Nothing was trained.")


def _differences(first: dict, other: dict, limit: int = 6) -> list[str]:
    """What ``other`` (a node's identity) says differently from ``first`` (node 0's), as "key (X here, Y on node 0)"
    items, at most ``limit`` of them."""
    flat_first, flat_other = _flat(first), _flat(other)
    keys = sorted(key for key in flat_first.keys() | flat_other.keys()
                  if key != "node" and flat_first.get(key) != flat_other.get(key))
    node = other["node"]
    found = [f"{_named(key)} ({flat_other.get(key, 'unset')} on node {node}, {flat_first.get(key, 'unset')} on node 0)"
             for key in keys[:limit]]
    return found + ([f"{len(keys) - limit} more"] if len(keys) > limit else [])


def _flat(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        flat: dict = {}
        for key, item in value.items():
            flat.update(_flat(item, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: json.dumps(value) if isinstance(value, list) else value}


def _named(key: str) -> str:
    """A dotted identity key as a person reads it: a recipe key as written, a version as "torch version"."""
    if key.startswith("recipe."):
        return key.removeprefix("recipe.")
    if key.startswith("versions."):
        return f"{key.removeprefix('versions.')} version"
    return key
