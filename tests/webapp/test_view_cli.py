"""`neuron-explorer view` as a user runs it: prints the URL, serves, stops on Ctrl-C, one-line
errors."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import urllib.request

import pytest

KINETO = "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"


@pytest.mark.parametrize("given", ["folder", "file"])
def test_view_serves_on_loopback_and_stops_on_ctrl_c(real_traces_dir, tmp_path, given):
    shutil.copy(real_traces_dir / KINETO, tmp_path / KINETO)
    target = tmp_path if given == "folder" else tmp_path / KINETO
    proc = subprocess.Popen([sys.executable, "-m", "neuron_explorer", "view", str(target),
                             "--no-browser", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line, \
            (line, proc.stderr.read() if proc.poll() is not None else "")
        # a file is what it serves first; the folder's other traces are there too
        served = (f"serving {tmp_path.resolve()} at" if given == "folder" else
                  f"serving {KINETO} (and the other traces in {tmp_path.resolve()}) at")
        assert served in line, line
        url = line.split(" at ", 1)[1].split()[0]
        page = urllib.request.urlopen(url, timeout=20).read().decode()
        assert "Neuron Explorer" in page
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_view_of_a_bad_trace_fails_in_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\x00\x01garbage")
    proc = subprocess.run([sys.executable, "-m", "neuron_explorer", "view", str(bad),
                           "--no-browser", "--port", "0"],
                          check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "bad.json" in proc.stderr, proc.stderr
