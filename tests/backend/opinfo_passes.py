"""`opinfo_child.py`'s runs one after another in one child process, for `test_opinfo.py`:
the first samples of every op, then every sample of every op, without a second start-up
(importing torch and its OpInfo database, 4 s of CPU).

    python tests/backend/opinfo_passes.py SAMPLES_PER_OP [SAMPLES_PER_OP ...] [--after PASS OP]

Each SAMPLES_PER_OP is a pass over every op, as `opinfo_child.py SAMPLES_PER_OP` runs them
(0: every sample), in the order given; `--after PASS OP` starts in pass PASS (its index)
after OP. Reports as opinfo_child.py's, each with its pass: `{"start": op, "pass": n}`,
then `{"op": op, "pass": n, "status": ..., "reason": ...}`.
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
from opinfo_child import op_db, op_key, run_op


def main(argv: list[str]) -> None:
    after: tuple[int, str] | None = None
    if "--after" in argv:
        at = argv.index("--after")
        after = (int(argv[at + 1]), argv[at + 2])
        argv = argv[:at] + argv[at + 3:]
    passes = [int(a) for a in argv]
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    for n, samples_per_op in enumerate(passes):
        if after is not None and n < after[0]:
            continue
        # in the pass the last child died in: the ops up to and including its last
        skip_through = after[1] if after is not None and n == after[0] else None
        for op in op_db:
            key = op_key(op)
            if skip_through is not None:
                skip_through = None if key == skip_through else skip_through
                continue
            print(json.dumps({"start": key, "pass": n}), flush=True)
            torch.manual_seed(0)
            status, reason = run_op(op, samples_per_op)
            print(json.dumps({"op": key, "pass": n, "status": status, "reason": reason}),
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
