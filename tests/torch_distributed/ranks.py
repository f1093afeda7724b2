"""Run a function of `rank_worker.py` on N ranks (one process each) and collect results."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("rank_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(scenario: str, world: int, tmp_path: Path, timeout: float = 90,
              env: dict[str, str] | None = None) -> list[dict]:
    """Start `world` ranks of `scenario`; return each rank's result (its JSON, or its
    exit code and stderr when it wrote none)."""
    import datetime

    import torch.distributed as dist

    port = free_port()
    # The store lives here, as torchrun's agent holds it: a rank that exits takes nothing
    # the others still need with it.
    store = dist.TCPStore("127.0.0.1", port, world, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    procs = []
    for rank in range(world):
        rank_env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                    "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                    "TORCHELASTIC_USE_AGENT_STORE": "True",
                    "OMP_NUM_THREADS": "1", **(env or {})}
        out = tmp_path / f"result{rank}.json"
        procs.append((subprocess.Popen(
            [sys.executable, str(WORKER), scenario, str(out)], env=rank_env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True), out))
    results = []
    try:
        for proc, out in procs:
            _, stderr = proc.communicate(timeout=timeout)
            result = json.loads(out.read_text()) if out.exists() else {}
            result.update(returncode=proc.returncode, stderr=stderr[-4000:])
            results.append(result)
    finally:
        del store
        for proc, _ in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return results
