"""The run folder of a recorded torchrun: names, launcher detection, manifest, summary."""

from __future__ import annotations

import pytest
from neuron_explorer.collectors import run_folder
from neuron_explorer.collectors.child_processes import child_path
from neuron_explorer.collectors.program import COMMAND, MODULE, SCRIPT, Program
from neuron_explorer.collectors.trace_writer import RecordingError


def test_launchers_are_recognised():
    assert run_folder.is_launcher(Program(COMMAND, "/usr/bin/torchrun", ["train.py"]))
    assert run_folder.is_launcher(Program(MODULE, "torch.distributed.run", ["train.py"]))
    assert not run_folder.is_launcher(Program(SCRIPT, "train.py", []))
    assert not run_folder.is_launcher(Program(COMMAND, "bash", ["-c", "torchrun"]))


def test_names_and_world_size(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    program = Program(COMMAND, "torchrun", ["--nproc-per-node", "4", "--nnodes=2", "t.py", "-x"])
    assert run_folder.script_stem(program) == "t"
    assert run_folder.launched_world_size(program) == 8
    assert run_folder.launched_world_size(Program(COMMAND, "torchrun", ["t.py"])) is None
    assert run_folder.default_folder("t") == "t.run"
    (tmp_path / "t.run").mkdir()
    assert run_folder.default_folder("t") == "t.1.run"
    assert child_path("/x/rank.pftrace", 42, "3", "/x") == "/x/rank3.pftrace"
    assert child_path("/x/rank.pftrace", 42, None, "/x") == "/x/pid42.pftrace"
    assert child_path("/y/run.pftrace", 42, "1") == "/y/run.rank1.pftrace"


def test_folder_errors_and_replacing(tmp_path, capsys):
    target = tmp_path / "file.run"
    target.write_text("")
    with pytest.raises(RecordingError, match="it is a file"):
        run_folder.prepare_folder(str(target))
    with pytest.raises(RecordingError, match="does not exist"):
        run_folder.prepare_folder(str(tmp_path / "missing" / "a.run"))
    run = tmp_path / "a.run"
    run.mkdir()
    (run / "rank0.pftrace").write_bytes(b"old")
    (run / "notes.txt").write_text("mine")
    run_folder.prepare_folder(str(run))
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]  # only our files go
    assert "replacing the run" in capsys.readouterr().err


def test_manifest_and_summary_list_the_ranks(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_HARDWARE", "trn1")
    monkeypatch.setenv("NEURON_TOPOLOGY", "ranks_per_chip=1")
    for r in (1, 0, 10):
        (tmp_path / f"rank{r}.pftrace").write_bytes(b"x" * 10)
    program = Program(COMMAND, "torchrun", ["--nproc_per_node=3", "t.py"])
    data = run_folder.manifest(program, str(tmp_path), "op", (1, 3), "pftrace", 0)
    assert data["world_size"] == 3 and data["preset"] == "trn1"
    assert data["topology"]["ranks_per_chip"] == 1
    assert data["topology"]["chips_per_instance"] == 16
    assert [r["rank"] for r in data["ranks"]] == [0, 1, 10]
    text = run_folder.summary(str(tmp_path), data)
    assert "3 rank traces" in text and "rank 10:" in text and "manifest" in text
    # the run opens as a whole (the Ranks page), not as one of its rank's traces
    assert f"open it: neuron-explorer view {tmp_path}  |" in text
