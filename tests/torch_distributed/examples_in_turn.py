"""One torchrun rank that runs several example scripts in turn, each as `python SCRIPT ARGS`
would (as `__main__`, its folder first on the path), each with a store of its own:

    torchrun --nproc_per_node=2 examples_in_turn.py SCRIPT ARGS... ";;" SCRIPT ARGS...

A launch of two ranks costs seconds of imports before the first step; the scripts share
it. A script's process group finds its store as under torchrun (MASTER_PORT, the agent's
store): here one that rank 0 hosts for that script alone, as torchrun's agent hosts its
own. In torchrun's store the second group would read the first one's keys (a group is
named by a counter that `destroy_process_group` resets) and gloo would connect to the
first group's closed sockets.
"""

from __future__ import annotations

import datetime
import os
import runpy
import sys

import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=300)


def runs(words: list[str]) -> list[list[str]]:
    groups: list[list[str]] = [[]]
    for word in words:
        if word == ";;":
            groups.append([])
        else:
            groups[-1].append(word)
    return groups


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host = os.environ["MASTER_ADDR"]
    assert os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True", "run it under torchrun"
    agent = dist.TCPStore(host, int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=TIMEOUT, wait_for_workers=False)  # torchrun's, for ports
    path0 = sys.path[0]
    for k, (script, *args) in enumerate(runs(sys.argv[1:])):
        store = None
        if rank == 0:  # a port the OS picked, held from now until every rank is done
            store = dist.TCPStore(host, 0, world, is_master=True, wait_for_workers=False,
                                  timeout=TIMEOUT)
            agent.set(f"examples_in_turn/{k}/port", str(store.port))
        os.environ["MASTER_PORT"] = agent.get(f"examples_in_turn/{k}/port").decode()
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # a client of that store
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        try:
            runpy.run_path(script, run_name="__main__")
        finally:
            sys.path[0] = path0
        agent.set(f"examples_in_turn/{k}/done/{rank}", "")
        agent.wait([f"examples_in_turn/{k}/done/{r}" for r in range(world)])
        del store


if __name__ == "__main__":
    main()
