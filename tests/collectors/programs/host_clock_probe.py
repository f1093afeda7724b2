"""Four device ops with, between them: Python work while a busy process shares the CPU,
a sleep, and a garbage-collector pause. Prints what each really took, as JSON."""

import gc
import json
import os
import subprocess
import sys
import time

import torch

BUSY = "import time\nend = time.monotonic() + 20\nwhile time.monotonic() < end: pass\n"


def python_work() -> None:
    x = 0
    for i in range(1_500_000):
        x += i * i


def main() -> None:
    os.sched_setaffinity(0, {0})  # this process and the busy one (which inherits it)
    busy = subprocess.Popen([sys.executable, "-c", BUSY])  # share one CPU
    try:
        a = torch.ones(4, device="neuron")
        time.sleep(0.2)  # the busy process is running
        gc.disable()
        garbage = []
        for _ in range(300_000):
            node = [None]
            node[0] = node  # a cycle only the collector frees
            garbage.append(node)
        del garbage, node
        torch.neg(a)
        cpu0, wall0 = time.thread_time_ns(), time.perf_counter_ns()
        python_work()
        work_cpu, work_wall = time.thread_time_ns() - cpu0, time.perf_counter_ns() - wall0
        torch.abs(a)
        time.sleep(0.05)
        torch.sin(a)
        cpu0 = time.thread_time_ns()
        gc.collect()
        gc_cpu = time.thread_time_ns() - cpu0
        torch.cos(a)
    finally:
        busy.kill()
        busy.wait()
    print(json.dumps({"work_cpu": work_cpu, "work_wall": work_wall, "gc_cpu": gc_cpu}))


if __name__ == "__main__":
    main()
