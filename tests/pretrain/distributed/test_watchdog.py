"""pretrain.distributed.watchdog without DeepSpeed: watchdogs in threads on one loopback TCPStore.

A silent rank is named (with its host) by every other rank, once; ranks that end at different
times never report each other; a store that goes away is reported; the store's host waits for
the others' end marks before it leaves.
"""

from __future__ import annotations

import gc
import socket
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from bertforge.pretrain.distributed.startup import free_port
from bertforge.pretrain.distributed.watchdog import Watchdog, looks_like_peer_loss

TIMEOUT, INTERVAL = 1.0, 0.1


def _server(port: int):
    return dist.TCPStore(
        "127.0.0.1", port, None, True, timedelta(seconds=5), wait_for_workers=False
    )


class _Ranks:
    """``world`` watchdogs on the store at ``port``; ``lost[r]`` holds rank r's reports."""

    def __init__(self, port: int, world: int, namespace: str):
        self.lost: dict[int, list[tuple[float, str]]] = {r: [] for r in range(world)}
        self.dogs = [
            Watchdog(
                "127.0.0.1",
                port,
                r,
                world,
                TIMEOUT,
                namespace=namespace,
                hosts_store=r == 0,
                interval_s=INTERVAL,
                on_lost=lambda msg, r=r: self.lost[r].append((time.monotonic(), msg)),
            ).start()
            for r in range(world)
        ]

    def stop(self, done: bool = True) -> None:
        for d in reversed(self.dogs):
            d.stop(done=done)


def _wait_for(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    return cond()


def test_a_silent_rank_is_named_with_its_host_by_every_other_rank_once():
    port = free_port()
    server = _server(port)
    ranks = _Ranks(port, 3, "t1/")
    time.sleep(3 * INTERVAL)
    killed = time.monotonic()
    ranks.dogs[1].stop(done=False)  # rank 1 goes silent, as after a kill -9
    assert _wait_for(lambda: ranks.lost[0] and ranks.lost[2], TIMEOUT + 10 * INTERVAL + 2)
    time.sleep(3 * INTERVAL)  # no second report
    host = socket.gethostname()
    for r in (0, 2):
        assert len(ranks.lost[r]) == 1, ranks.lost[r]
        at, message = ranks.lost[r][0]
        assert f"rank 1 on {host} stopped beating" in message, message
        assert at - killed < TIMEOUT + 10 * INTERVAL + 1.0
    assert "noticed by rank 0" in ranks.lost[2][0][1]  # rank 0 watches rank 1; rank 2 reads it
    assert ranks.lost[1] == []
    ranks.stop(done=False)
    del server


def test_ranks_that_end_at_different_times_never_report_each_other():
    port = free_port()
    server = _server(port)
    ranks = _Ranks(port, 3, "t2/")
    time.sleep(2 * INTERVAL)
    ranks.dogs[1].stop()  # rank 1 finished first
    time.sleep(TIMEOUT + 5 * INTERVAL)
    ranks.dogs[2].stop()
    host_left = threading.Thread(target=ranks.dogs[0].stop)
    host_left.start()
    host_left.join(timeout=5)
    assert not host_left.is_alive()
    assert all(v == [] for v in ranks.lost.values()), ranks.lost
    del server


def test_the_store_host_waits_for_every_end_mark_and_a_vanished_store_is_reported():
    port = free_port()
    server = _server(port)
    ranks = _Ranks(port, 2, "t3/")
    time.sleep(2 * INTERVAL)
    host_left = threading.Thread(target=ranks.dogs[0].stop)
    host_left.start()
    time.sleep(0.3)
    assert host_left.is_alive()  # rank 0 serves the store: it waits for rank 1's end mark
    ranks.dogs[1].stop()
    host_left.join(timeout=5)
    assert not host_left.is_alive()
    assert all(v == [] for v in ranks.lost.values()), ranks.lost

    # The store's host dies under a running watchdog (rank 1 of a new job on the same server).
    other = _Ranks(port, 2, "t4/")
    time.sleep(3 * INTERVAL)  # rank 1 has read rank 0's host
    other.dogs[0].stop(done=False)
    del server
    gc.collect()
    assert _wait_for(lambda: other.lost[1], TIMEOUT + 10 * INTERVAL + 2), "store loss not seen"
    message = other.lost[1][0][1]
    assert "lost the rendezvous store at 127.0.0.1" in message, message
    assert f"rank 0 on {socket.gethostname()}" in message, message


def test_only_errors_that_say_a_peer_went_away_wait_for_the_verdict():
    gloo = "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:43404: Connection reset by peer"
    assert looks_like_peer_loss(RuntimeError(gloo))
    try:
        try:
            raise RuntimeError("Connection closed by peer [127.0.0.1]:5000")
        except RuntimeError as e:
            raise ValueError("the save failed") from e
    except ValueError as chained:
        assert looks_like_peer_loss(chained)
    assert not looks_like_peer_loss(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not looks_like_peer_loss(KeyError("step"))
