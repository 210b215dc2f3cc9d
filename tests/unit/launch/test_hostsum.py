"""The step agreement's sum: recursive doubling over a gloo group, lazily connected."""

from __future__ import annotations

import math
from collections import defaultdict, deque

import pytest

from hpcrun.errors import ArgumentError
from hpcrun.launch.hostsum import Move, doubling_schedule
from tests.unit.launch.test_dist import gang, results, spawn


def simulate(values: list[int]) -> tuple[list[int], int]:
    """Run every rank's schedule against FIFO channels; (each rank's result, rounds taken).

    A rank's step runs once what it receives has been sent, so a schedule that deadlocks or
    pairs a send with the wrong receive fails here."""
    world = len(values)
    plans = [deque(doubling_schedule(r, world)) for r in range(world)]
    total = list(values)
    channel: dict[tuple[int, int], deque[int]] = defaultdict(deque)
    sent: set[int] = set()  # ranks whose current step's send is out
    rounds = 0
    while any(plans):
        rounds += 1
        progressed = False
        for r in range(world):  # post this round's sends first (isend)
            if plans[r] and plans[r][0].move in (Move.SEND, Move.SWAP) and r not in sent:
                channel[(r, plans[r][0].peer)].append(total[r])
                sent.add(r)
        for r in range(world):
            if not plans[r]:
                continue
            step = plans[r][0]
            if step.move == Move.SEND:
                plans[r].popleft(), sent.discard(r)
                progressed = True
                continue
            inbox = channel[(step.peer, r)]
            if not inbox:
                continue
            got = inbox.popleft()
            total[r] = got if step.move == Move.TAKE else total[r] + got
            plans[r].popleft(), sent.discard(r)
            progressed = True
        assert progressed, "the schedule deadlocked"
    assert not any(channel.values()), "a message was never received"
    return total, rounds


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 33, 100])
def test_every_rank_gets_the_sum_in_log2_rounds_talking_to_log2_peers(world: int) -> None:
    values = [3 * r + 1 for r in range(world)]
    got, rounds = simulate(values)
    assert got == [sum(values)] * world
    p = 1 << (world.bit_length() - 1)
    assert rounds <= int(math.log2(p)) + 2 + 1
    for r in range(world):
        peers = {s.peer for s in doubling_schedule(r, world)}
        assert len(peers) <= int(math.log2(p)) + 1
        assert r not in peers and all(0 <= q < world for q in peers)


def test_a_rank_outside_the_world_is_refused() -> None:
    with pytest.raises(ArgumentError, match="outside a world of 4"):
        doubling_schedule(4, 4)


AGREE = """
    import json, os
    import torch.distributed as dist
    from hpcrun.launch.env import DistEnv
    from hpcrun.launch.dist import form_groups
    from hpcrun.launch.gpu import GpuSettings
    from hpcrun.runtime.preemption import agree_sum

    def sockets():
        fds = os.listdir("/proc/self/fd")
        return sum(os.readlink(f"/proc/self/fd/{fd}").startswith("socket:") for fd in fds
                   if os.path.exists(f"/proc/self/fd/{fd}"))

    env = DistEnv.from_environ(dict(os.environ))
    groups = form_groups(env, GpuSettings.from_environ(dict(os.environ)))
    before = sockets()
    sums = [agree_sum([env.rank, 1, 7]) for _ in range(3)]
    print(json.dumps({"sums": sums, "sockets": sockets() - before,
                      "lazy": os.environ.get("TORCH_GLOO_LAZY_INIT")}), flush=True)
    dist.barrier()
    os._exit(0)
"""


def test_the_agreement_sums_over_an_odd_gloo_world_connecting_only_its_peers() -> None:
    world = 5
    settings = {"HPCRUN_DIST_BACKEND": "gloo", "HPCRUN_PG_INIT_TIMEOUT_S": "60",
                "HPCRUN_STEP_TIMEOUT_S": "60", "HPCRUN_CKPT_TIMEOUT_S": "60"}
    out = results([spawn(AGREE, env, **settings) for env in gang(world)], timeout=120)
    for r, got in enumerate(out):
        assert got["sums"] == [[sum(range(world)), world, 7 * world]] * 3
        assert got["lazy"] == "1"
        peers = {s.peer for s in doubling_schedule(r, world)}
        # a connection per peer it talks to (gloo may open one more for a pair): never the
        # whole world, which an eager mesh connects when the group forms
        assert got["sockets"] <= 2 * len(peers), (r, got)
