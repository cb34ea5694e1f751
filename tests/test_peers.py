"""A rank that lost its peers names them (``ft.run.peers``), read against a real rendezvous store (torch's TCPStore,
served in this process as node 0's launcher serves it): ranks whose heartbeat stood still are lost, a rank that left
after its own roll call is not, a store that cannot be reached is node 0 gone; and the words for each. Nodes started
differently are refused naming each difference, and a rank that took a stop is not killed by the SIGTERM its launcher
sends as it ends. The whole paths, on two real nodes, are tests/test_nodes.py."""

from __future__ import annotations

import signal
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from ft.run import peers


@pytest.fixture
def store(monkeypatch):
    """A TCPStore served here, and this process made rank 0 of 6 ranks, 2 on each of 3 nodes, that reach it."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port), "RANK": "0", "WORLD_SIZE": "6",
                        "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "0"}.items():
        monkeypatch.setenv(name, value)
    previous = signal.getsignal(signal.SIGTERM)
    yield server
    signal.signal(signal.SIGTERM, previous)  # the roll call ignores SIGTERM for the rest of a rank's life


def test_the_ranks_whose_heartbeat_stood_still_are_lost_grouped_by_node(store):
    """Rank 1 beats (its thread, as ``beat`` starts it), rank 5 left after its own roll call; ranks 2 and 3 (all of
    node 1) and rank 4 (half of node 2) never beat again."""
    done = threading.Event()

    def rank_1_beats():
        while not done.is_set():
            store.add(peers.store_key("beat", 1), 1)
            done.wait(0.1)

    beating = threading.Thread(target=rank_1_beats)
    beating.start()
    for rank in (2, 3, 4):
        store.add(peers.store_key("beat", rank), 7)  # they beat before, then stopped
    store.set(peers.store_key("left", 5), "1")
    try:
        call = peers.roll_call(seconds=1.0)
    finally:
        done.set()
        beating.join()
    assert call.lost == (2, 3, 4) and call.survivors() == [0, 1, 5] and call.speaks()
    assert call.who() == "node 1 (ranks 2, 3) and rank 4 (node 2)"
    assert store.check([peers.store_key("left", 0)])  # a later survivor's roll call does not take this one for lost
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


def test_beat_keeps_counting_while_the_main_thread_is_busy(store, monkeypatch):
    monkeypatch.setattr(peers, "BEAT_SECONDS", 0.01)
    peers.beat()
    deadline = time.monotonic() + 60
    while store.add(peers.store_key("beat", 0), 0) < 3:  # its thread's beats, while this one waits here
        assert time.monotonic() < deadline, "rank 0 stopped beating"
        time.sleep(0.01)


def test_a_store_that_cannot_be_reached_is_node_0_lost(store, monkeypatch):
    monkeypatch.setenv("MASTER_PORT", "1")  # nothing listens there
    call = peers.roll_call(seconds=0.5)
    assert call.lost is None and "node 0, which serves the rendezvous store" in call.who()


def test_the_paragraph_names_the_lost_the_step_the_checkpoint_and_the_command():
    failure = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:4431")
    assert peers.peer_failure(failure) and not peers.peer_failure(RuntimeError("CUDA out of memory"))
    call = peers.RollCall(rank=1, world=4, per_node=2, lost=(2, 3))
    lost = peers.explain(failure, peers.RollCall(rank=0, world=4, per_node=2, lost=(2, 3)), 6, 8, 60,
                         "runs/x/checkpoint-4", "ft train r.yaml --node-rank 0")
    said = lost.render()
    assert said.startswith("ft: node 1 (ranks 2, 3) was lost after step 6 of 8") and lost.exit_code == 1
    assert "checkpoint-4" in said and "ft train r.yaml --node-rank 0" in said and "collective_timeout (60 s)" in said
    assert not call.speaks() and "the lowest rank of this node says more" in str(peers.explain(failure, call, 6, 8, 60,
                                                                                                None, "ft train"))
    everyone = peers.RollCall(rank=0, world=4, per_node=2, lost=())
    assert peers.explain(failure, everyone, 6, 8, 60, None, "ft train") is None  # another failure: raised as it is


def test_nodes_with_other_versions_or_recipes_are_refused_naming_each_difference(store, monkeypatch):
    """Rank 0 of 2 (one per node) reads node 1's identity from the store: another torch, another learning rate; both
    named, with node 0's values, in one exit-2 paragraph (tests/test_nodes.py runs it on two real nodes)."""
    import json

    for name, value in {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0", "LOCAL_RANK": "0",
                        "TORCHELASTIC_USE_AGENT_STORE": "True"}.items():
        monkeypatch.setenv(name, value)
    recipe = {"optimizer": {"lr": 0.003}, "launch": {"node_rank": 0}}
    versions = {"ft": "0.9.0", "torch": "2.13.0"}
    node_1 = {"node": 1, "processes per node": "1", "versions": {**versions, "torch": "2.12.1"},
              "recipe": {"optimizer": {"lr": 0.002}}}  # its launch: section (node_rank 1) is its own
    store.set(peers.store_key("identity", 1), json.dumps(node_1))
    with pytest.raises(peers.NodesDiffer) as refused:
        peers.agree(recipe, versions)
    said = refused.value.render()
    assert refused.value.exit_code == 2
    assert ("node 1 differs from node 0 in optimizer.lr (0.002 on node 1, 0.003 on node 0), torch version (2.12.1 on "
            "node 1, 2.13.0 on node 0)") in said, said
    store.set(peers.store_key("identity", 1), json.dumps({**node_1, "versions": versions,
                                                          "recipe": {"optimizer": {"lr": 0.003}}}))
    peers.agree(recipe, versions)  # the same run on both: nothing said


def test_a_rank_that_took_a_stop_ignores_the_sigterm_its_launcher_sends_while_it_ends():
    """After a stop taken at a step end, the process is ending with it (its summary, exit 143): torch's launcher sends
    SIGTERM to a node's remaining ranks once one has exited, and that must not kill one still writing. Without a stop
    the handlers from before are put back."""
    from ft.run.signals import StopWatch

    previous = signal.getsignal(signal.SIGTERM)
    try:
        with StopWatch(pass_on=False):
            pass
        assert signal.getsignal(signal.SIGTERM) == previous
        with StopWatch(pass_on=False) as watch:
            signal.raise_signal(signal.SIGTERM)
        assert watch.received == signal.SIGTERM and signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)
