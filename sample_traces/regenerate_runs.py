"""Records the multi-rank sample runs (one folder, one trace per rank) from examples/.

    .venv/bin/python sample_traces/regenerate_runs.py            # all of them
    .venv/bin/python sample_traces/regenerate_runs.py straggler  # just one

Each run goes through the real entry point, `neuron-explorer record -- torchrun ...`
(`python -m torch.distributed.run`), and every trace in it must stay under 5 MB.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
MAX_BYTES = 5 * 1024 * 1024

# run name -> (record options, ranks, script, script arguments)
RUNS: dict[str, tuple[list[str], int, str, list[str]]] = {
    "ddp": (["--level", "op", "--steps", "2:5"], 4, "ddp.py", ["--steps", "5"]),
    "fsdp": (["--level", "op", "--steps", "2:4"], 2, "fsdp.py", ["--steps", "4"]),
    "straggler": (["--level", "op", "--steps", "2:6"], 3, "straggler.py", ["--steps", "6"]),
}


def record(name: str) -> Path:
    options, ranks, script, script_args = RUNS[name]
    out = HERE / f"{name}.run"
    shutil.rmtree(out, ignore_errors=True)
    cli = Path(sys.executable).with_name("neuron-explorer")
    cmd = [str(cli), "record", "-o", str(out), *options, "--", "python", "-m",
           "torch.distributed.run", f"--nproc_per_node={ranks}", str(EXAMPLES / script),
           *script_args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=HERE, env={**os.environ, "OMP_NUM_THREADS": "1"})
    for trace in out.glob("rank*.pftrace"):
        if trace.stat().st_size > MAX_BYTES:
            raise SystemExit(f"{trace} is {trace.stat().st_size / 2**20:.1f} MiB, over the "
                             "5 MiB limit: record fewer steps")
    return out


def main(argv: list[str]) -> int:
    names = argv or list(RUNS)
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        raise SystemExit(f"unknown run(s): {', '.join(unknown)}; choose from {', '.join(RUNS)}")
    for name in names:
        record(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
