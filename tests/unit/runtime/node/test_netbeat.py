"""Liveness over the network: the beat's wire format, what a receiver refuses, the fan-out."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hpcrun.errors import FormatError
from hpcrun.runtime.node.membership import LivenessBeat, LivenessWatch, alive_path
from hpcrun.runtime.node.netbeat import (
    MAX_BEAT_BYTES,
    WATCHERS,
    Beat,
    BeatBoard,
    BeatReceiver,
    BeatScope,
    BeatSender,
    beat_peers,
    decode_beat,
    encode_beat,
    publish_endpoint,
    read_endpoint,
)
from hpcrun.testing import FakeClock

SECRET = b"s" * 64
NODES = ("n0", "n1", "n2", "n3")
SCOPE = BeatScope(run_id="r1", job_start="job7.r0.", nodes=frozenset(NODES))
BEAT = Beat(run_id="r1", job_start="job7.r0.", node="n2", counter=41)


def test_a_beat_round_trips() -> None:
    assert decode_beat(encode_beat(BEAT, SECRET), SCOPE, SECRET) == BEAT


@pytest.mark.parametrize(("beat", "why"), [
    (Beat(run_id="r2", job_start="job7.r0.", node="n2", counter=1), "of run 'r2'"),
    (Beat(run_id="r1", job_start="job7.r1.", node="n2", counter=1), "job start 'job7.r1.'"),
    (Beat(run_id="r1", job_start="job7.r0.", node="n9", counter=1), "not a node of this"),
])
def test_a_foreign_beat_is_refused_and_says_why(beat: Beat, why: str) -> None:
    with pytest.raises(FormatError, match=why):
        decode_beat(encode_beat(beat, SECRET), SCOPE, SECRET)


def test_a_beat_signed_with_another_secret_is_refused() -> None:
    with pytest.raises(FormatError, match="signature"):
        decode_beat(encode_beat(BEAT, b"other"), SCOPE, SECRET)


def _signed(body: dict[str, object]) -> bytes:
    from hpcrun.runtime.node.netbeat import _mac

    return json.dumps({**body, "mac": _mac(SECRET, body)}).encode()


@pytest.mark.parametrize(("data", "why"), [
    (b"x" * (MAX_BEAT_BYTES + 1), "bytes refused"),
    (b"\xff\xfe not json", "not JSON"),
    (b"[1, 2]", "fields"),
    (json.dumps({"v": 1, "run": "r1", "start": "job7.r0.", "node": "n2", "n": 1}).encode(),
     "fields"),
    (_signed({"v": 1, "run": "r1", "start": "job7.r0.", "node": "n2", "n": "7"}), "counter"),
    (_signed({"v": 1, "run": "r1", "start": "job7.r0.", "node": "n2", "n": True}), "counter"),
    (_signed({"v": 1, "run": "r1", "start": "job7.r0.", "node": "n2", "n": -1}), "counter"),
    (_signed({"v": 2, "run": "r1", "start": "job7.r0.", "node": "n2", "n": 1}), "schema"),
    (_signed({"v": 1, "run": "r1", "start": "job7.r0.", "node": ["n2"], "n": 1}), "node"),
])
def test_malformed_beats_are_refused(data: bytes, why: str) -> None:
    with pytest.raises(FormatError, match=why):
        decode_beat(data, SCOPE, SECRET)


def test_an_oversized_name_is_refused_at_the_sender() -> None:
    with pytest.raises(FormatError, match="shorten"):
        encode_beat(Beat(run_id="r" * 600, job_start="j", node="n", counter=1), SECRET)


def test_the_board_keeps_only_newer_beats_at_its_own_time() -> None:
    clock = FakeClock()
    board = BeatBoard(clock=clock)
    assert board.record(BEAT)
    t0 = clock.monotonic()
    clock.advance(2.0)
    assert not board.record(BEAT), "a replayed datagram says nothing new"
    assert board.heard() == {"n2": t0}
    assert board.record(Beat(run_id="r1", job_start="job7.r0.", node="n2", counter=42))
    assert board.heard() == {"n2": t0 + 2.0}


def test_the_fan_out_is_linear_in_the_nodes() -> None:
    nodes = [f"n{i:04d}" for i in range(2048)]
    per_beat = sum(len(beat_peers(n, nodes)) for n in nodes)
    assert per_beat == 2 * WATCHERS * len(nodes) - 12  # O(N): 6 datagrams a node
    assert beat_peers("n0000", nodes) == tuple(nodes[1:]), "a watcher hears everyone"
    assert beat_peers("n0100", nodes) == tuple(nodes[:WATCHERS])
    assert beat_peers("n1", ("n0", "n1")) == ("n0",)


def test_an_endpoint_of_an_earlier_allocation_is_not_used(tmp_path: Path) -> None:
    publish_endpoint(tmp_path, "n1", ("127.0.0.1", 4000), job_start="job7.r0.")
    assert read_endpoint(tmp_path, "n1", job_start="job7.r0.") == ("127.0.0.1", 4000)
    assert read_endpoint(tmp_path, "n1", job_start="job7.r1.") is None
    assert read_endpoint(tmp_path, "n2", job_start="job7.r0.") is None


def test_beats_cross_a_real_socket_and_foreign_ones_are_counted_not_kept(
        tmp_path: Path) -> None:
    board = BeatBoard()
    with BeatReceiver("127.0.0.1", scope=SCOPE, secret=SECRET, board=board) as receiver:
        publish_endpoint(tmp_path, "n0", receiver.address, job_start="job7.r0.")
        good = BeatSender(tmp_path, beat=BEAT, peers=["n0"], secret=SECRET)
        forged = BeatSender(tmp_path, beat=BEAT, peers=["n0"], secret=b"intruder")
        for sender in (good, forged):
            sender.resolve()
        deadline = time.monotonic() + 5
        counter = 0
        while time.monotonic() < deadline and ("n2" not in board.heard() or
                                               receiver.refused == 0):
            counter += 1
            assert good.send(counter) == 1 and forged.send(10_000 + counter) == 1
            time.sleep(0.02)
        good.close()
        forged.close()
    assert "n2" in board.heard() and receiver.refused >= 1


def test_an_agent_beat_keeps_its_watcher_alive_while_its_file_is_stuck(
        tmp_path: Path) -> None:
    """The file thread blocked (a stalled shared tier) does not silence the network beat."""
    board = BeatBoard()

    class StuckStorage:
        def makedirs(self, path: object, mode: int = 0o750) -> None:
            Path(str(path)).mkdir(parents=True, exist_ok=True)

        def replace_bytes(self, path: object, data: bytes) -> None:
            time.sleep(30)

        def read_bytes(self, path: object) -> bytes:
            return Path(str(path)).read_bytes()

    with BeatReceiver("127.0.0.1", scope=SCOPE, secret=SECRET, board=board) as receiver:
        publish_endpoint(tmp_path, "n0", receiver.address, job_start="job7.r0.")
        sender = BeatSender(tmp_path, beat=BEAT, peers=["n0"], secret=SECRET)
        sender.resolve()
        watch = LivenessWatch(["n2"])
        beat = LivenessBeat(tmp_path, "n2", every_s=0.05, file_every_s=0.05, sender=sender,
                            storage=StuckStorage())  # type: ignore[arg-type]
        beat.__enter__()  # its file thread stays stuck: not joined here
        try:
            time.sleep(1.0)
            first = board.heard().get("n2")
            time.sleep(1.0)
            watch.observe_net(board.heard())
            assert first is not None and board.heard()["n2"] > first
            assert watch.stale(0.5) == ()
        finally:
            beat._stop.set()


def test_a_network_only_beat_writes_no_file_and_still_keeps_its_watcher_alive(
        tmp_path: Path) -> None:
    """A gang that requeues after a node loss beats only to learn of it quickly: no liveness
    file on the shared filesystem, the network beat alone; silent, it goes stale."""
    board = BeatBoard()
    with BeatReceiver("127.0.0.1", scope=SCOPE, secret=SECRET, board=board) as receiver:
        publish_endpoint(tmp_path, "n0", receiver.address, job_start="job7.r0.")
        sender = BeatSender(tmp_path, beat=BEAT, peers=["n0"], secret=SECRET)
        sender.resolve()
        watch = LivenessWatch(["n2"])
        with LivenessBeat(tmp_path, "n2", every_s=0.05, file_every_s=None, sender=sender):
            time.sleep(1.0)
            watch.observe_net(board.heard())
            assert watch.stale(0.5) == ()
        assert not alive_path(tmp_path, "n2").exists()
        time.sleep(0.7)
        watch.observe_net(board.heard())
        assert watch.stale(0.5) == ("n2",)
