"""Replay processes never outlive their launcher (issue 13): a launcher killed with
SIGKILL takes its ranks with it within 2 s (parent-death signal, launcher watchdog) and
the next run removes its temporary folder; a rank killed by a signal is reported as
killed, with the signal; an injected fault at a BATCH instruction fires; the rendezvous
store listens on the loopback address only. gloo, 2 ranks, tiny models, timeouts."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from replay_helpers import marked_pids, marked_rank_pids

torch = pytest.importorskip("torch")

from schedsim.replay.launch import TMP_PREFIX, store_socket  # noqa: E402

SMALL = ["--set", "hidden=8", "--set", "seq=2"]


def _start(marker: str, tmp: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, SCHEDSIM_TEST_MARKER=marker, TMPDIR=str(tmp))
    return subprocess.Popen([sys.executable, "-m", "schedsim", "replay", "--schedule", "1f1b",
                             "--ranks", "2", "--microbatches", "4", *SMALL, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_ranks(marker: str, n: int = 2, timeout: float = 60) -> list[int]:
    t0 = time.monotonic()
    while len(marked_rank_pids(marker, live_only=True)) < n and time.monotonic() - t0 < timeout:
        time.sleep(0.1)
    pids = marked_rank_pids(marker, live_only=True)
    assert len(pids) == n, pids
    return pids


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_launcher_sigkill_takes_its_ranks_and_the_next_run_removes_its_folder(tmp_path):
    """SIGKILL the launcher of a 2-rank replay (rank 0 hangs at instruction 3): no rank
    is running 2 s later (the old launcher left them ~53 s, until their own deadline);
    its temporary folder is gone once the next replay has started."""
    marker = f"schedsim-test-{uuid.uuid4().hex}"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = _start(marker, tmp, "--inject-fault", "0:3:hang", "--timeout", "100")
    try:
        _wait_ranks(marker)
        time.sleep(2.0)                    # ranks past their start-up
        folders = list(tmp.glob(TMP_PREFIX + "*"))
        assert len(folders) == 1
        p.kill()
        p.wait(timeout=10)
        killed = time.monotonic()
        while marked_rank_pids(marker, live_only=True) and time.monotonic() - killed < 10:
            time.sleep(0.05)
        gone_after = time.monotonic() - killed
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert marked_rank_pids(marker, live_only=True) == [] and gone_after < 2.0, gone_after
    assert folders[0].exists()             # SIGKILL: nothing could remove it then
    q = subprocess.run([sys.executable, "-m", "schedsim", "replay", "--schedule", "1f1b",
                        "--ranks", "1", "--microbatches", "1", *SMALL, "--timeout", "60"],
                       env=dict(os.environ, TMPDIR=str(tmp)), capture_output=True, text=True,
                       timeout=120)
    assert q.returncode == 0, q.stderr
    assert list(tmp.iterdir()) == []       # the next run swept the stale folder


def test_rank_without_its_launcher_stops_at_once() -> None:
    """The watchdog half of die_with_launcher: a rank whose parent is not the launcher
    it was given (the launcher is gone) ends with exit 1 at once."""
    code = ("import time\nfrom schedsim.replay.worker import die_with_launcher\n"
            "die_with_launcher(1)\ntime.sleep(30)\n")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert p.returncode == 1 and time.monotonic() - t0 < 20


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_a_rank_killed_by_a_signal_is_named_with_it(tmp_path):
    marker = f"schedsim-test-{uuid.uuid4().hex}"
    p = _start(marker, tmp_path, "--inject-fault", "0:3:hang", "--timeout", "100")
    try:
        pids = _wait_ranks(marker)
        time.sleep(2.0)
        rank1 = next(pid for pid in pids
                     if b"RANK=1\x00" in Path(f"/proc/{pid}/environ").read_bytes())
        os.kill(rank1, signal.SIGKILL)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 1, err
    assert err.strip().startswith("error: replay failed: rank 1 was killed by SIGKILL "
                                  "(signal 9; the out-of-memory killer or a 'kill -9')"), err
    assert len(err.strip().splitlines()) == 1
    assert marked_pids(marker, live_only=True) == []


def test_fault_at_a_batch_fires(tmp_path):
    """`--inject-fault 0:I` with instruction I a BATCH[...] (one batch_isend_irecv) stops
    the run there (it used to exit 0 when I was inside a post batch)."""
    from schedsim.generators import build_program
    from schedsim.program.ir import Batch

    prog = build_program("1f1b", 2, 4, "torch")
    i = next(k for k, ins in enumerate(prog.ranks[0]) if isinstance(ins, Batch)
             and len(ins.comms) > 1)
    p = subprocess.run([sys.executable, "-m", "schedsim", "replay", "--schedule", "1f1b",
                        "--ranks", "2", "--microbatches", "4", "--comm-policy", "torch",
                        *SMALL, "--inject-fault", f"0:{i}:raise", "--timeout", "60"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert f"rank 0: injected fault at instr {i} (BATCH[" in p.stderr


def test_store_listens_on_loopback_only() -> None:
    """The launcher's rendezvous socket is bound to 127.0.0.1 and rank 0's TCPStore
    serves it (master_listen_fd): nothing off this host can reach the store."""
    import torch.distributed as dist

    s = store_socket()
    try:
        host, port = s.getsockname()
        assert host == "127.0.0.1"
        store = dist.TCPStore("127.0.0.1", port, 1, True, timedelta(seconds=20),
                              master_listen_fd=s.fileno())
        store.set("k", "v")
        assert store.get("k") == b"v"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        s.close()


def test_a_peers_lost_connection_defers_to_the_rank_a_signal_killed(tmp_path):
    """Rank 1 killed by SIGKILL while rank 0's gloo raised "Connection closed by peer":
    the message names rank 1 (the origin), whichever wrote first (the race of
    test_a_rank_killed_by_a_signal_is_named_with_it, made deterministic)."""
    import json as _json
    import types

    from schedsim.replay.launch import _failure_message
    from schedsim.replay.worker import lost_peer

    gloo = ("RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer "
            "[127.0.0.1]:62129. This is typically caused by a remote worker crashing.")
    assert lost_peer(gloo) and not lost_peer("RuntimeError: shape mismatch")
    (tmp_path / "error-rank0.json").write_text(_json.dumps(
        {"rank": 0, "origin": not lost_peer(gloo), "message": f"rank 0: {gloo}",
         "time": 1.0}))
    procs = [types.SimpleNamespace(returncode=1), types.SimpleNamespace(returncode=-9)]
    logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
    msg = _failure_message(tmp_path, procs, logs, timed_out=False, timeout=100)
    assert msg == ("rank 1 was killed by SIGKILL (signal 9; the out-of-memory killer or a "
                   "'kill -9') (then rank(s) 0 failed too)")
