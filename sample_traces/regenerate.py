"""Records every sample trace from the scripts in examples/.

    .venv/bin/python sample_traces/regenerate.py            # all of them
    .venv/bin/python sample_traces/regenerate.py mlp_eager  # just one

Each trace is recorded through the real entry point, `neuron-explorer record`,
and must stay under 5 MB (the engine level is kept to a window of steps where a
whole run would be larger).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
MAX_BYTES = 5 * 1024 * 1024

# trace name -> (record options, script, script arguments)
SAMPLES: dict[str, tuple[list[str], str, list[str]]] = {
    "mlp_eager": (["--level", "engine"], "mlp_eager.py", ["--steps", "6"]),
    "gpt_eager": (["--level", "engine", "--steps", "2:4"], "gpt.py", ["--steps", "4"]),
    "gpt_compiled": (["--level", "engine", "--steps", "2:4"], "gpt.py",
                     ["--steps", "4", "--compile"]),
    "item_in_loop": (["--level", "engine", "--steps", "2:3"], "item_in_loop.py", ["--steps", "3"]),
    "slow_dataloader": (["--level", "engine", "--steps", "1:4"], "slow_dataloader.py",
                        ["--steps", "4"]),
    "host_fallback": (["--level", "engine", "--steps", "1:3"], "host_fallback.py",
                      ["--steps", "3"]),
    "odd_dims": (["--level", "op", "--steps", "1:3"], "odd_dims.py", ["--steps", "3"]),
    "fp32_matmul": (["--level", "engine", "--steps", "1:2"], "fp32_matmul.py", ["--steps", "2"]),
    "near_memory": (["--level", "op"], "near_memory.py", ["--steps", "3"]),
    "nki_kernels": (["--level", "engine"], "nki/profile_kernels.py", []),
    "generate": (["--level", "op"], "generate.py", []),
    "serve": (["--level", "op"], "serve.py", ["--requests", "8"]),
}


def record(name: str) -> Path:
    options, script, script_args = SAMPLES[name]
    out = HERE / f"{name}.pftrace"
    out.unlink(missing_ok=True)
    cli = Path(sys.executable).with_name("neuron-explorer")
    cmd = [str(cli), "record", "-o", str(out), *options,
           "--", "python", str(EXAMPLES / script), *script_args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=HERE)
    size = out.stat().st_size
    if size > MAX_BYTES:
        raise SystemExit(f"{out.name} is {size / 2**20:.1f} MiB, over the 5 MiB limit: "
                         "record fewer steps")
    return out


def main(argv: list[str]) -> int:
    names = argv or list(SAMPLES)
    unknown = [n for n in names if n not in SAMPLES]
    if unknown:
        raise SystemExit(f"unknown sample(s): {', '.join(unknown)}; "
                         f"choose from {', '.join(SAMPLES)}")
    for name in names:
        record(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
