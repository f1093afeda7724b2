"""Registration through the torch.backends entry point, in fresh interpreters."""

from __future__ import annotations

import json


def test_import_torch_alone_registers_the_device(fresh_python):
    result = fresh_python("""
        import json, sys, warnings
        import torch
        x = torch.arange(6.0).to("neuron")
        data = torch.utils.data.TensorDataset(torch.arange(8.0))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                batches = [b[0].to("neuron") for b in
                           torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)]
        pin_warnings = [str(w.message) for w in caught if "pin_memory" in str(w.message)]
        print(json.dumps({
            "device": str(torch.device("neuron")),
            "x_device": str(x.device),
            "is_neuron": x.is_neuron,
            "accelerator": str(torch.accelerator.current_accelerator()),
            "available": torch.accelerator.is_available(),
            "count": torch.accelerator.device_count(),
            "heavy": sorted(m for m in ("pandas", "dash", "duckdb") if m in sys.modules),
            "name": torch.neuron.get_device_name(),
            "pin_warnings": pin_warnings,
            "batches": [b.tolist() for b in batches],
        }))
    """)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout.strip().splitlines()[-1])
    assert info["device"] == "neuron"
    assert info["x_device"] == "neuron:0"
    assert info["is_neuron"] is True
    assert info["accelerator"] == "neuron"
    assert info["available"] is True
    assert info["count"] == 8  # trn2: 8 NeuronCores per chip
    assert info["heavy"] == []  # registration must not pull in pandas, Dash or DuckDB
    assert info["name"] == "Trainium2 NeuronCore-v3 (simulated)"
    # DataLoader(pin_memory=True) warns once, then loads unpinned batches.
    assert len(info["pin_warnings"]) == 1 and "neuron" in info["pin_warnings"][0]
    assert info["batches"] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]


def test_autoload_can_be_turned_off(fresh_python):
    result = fresh_python("""
        import torch
        print(torch._C._get_privateuse1_backend_name())
        print(hasattr(torch, "neuron"))
    """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["privateuseone", "False"]


def test_preset_from_environment_sets_device_count_and_memory(fresh_python):
    result = fresh_python("""
        import torch
        props = torch.neuron.get_device_properties(1)
        print(torch.neuron.device_count(), props.name, props.total_memory, props.preset)
    """, env={"NEURON_HARDWARE": "trn1"})
    assert result.returncode == 0, result.stderr
    count, *rest = result.stdout.split()
    assert int(count) == 2  # trn1: 2 NeuronCores per chip
    assert " ".join(rest[:3]) == "Trainium NeuronCore-v2 (simulated)"
    assert int(rest[3]) == 16 * 2**30  # 32 GiB HBM shared by 2 cores
    assert rest[4] == "trn1"


def test_unknown_preset_is_one_clear_error(fresh_python):
    result = fresh_python("""
        import torch
        from neuron_explorer.common.errors import NeuronExplorerError
        torch.manual_seed(0)  # seeding alone does not need the preset
        try:
            torch.zeros(2, device="neuron")
        except NeuronExplorerError as err:
            print("ERROR:", err)
    """, env={"NEURON_HARDWARE": "trn9"})
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith("ERROR:")
    assert "trn9" in line and "NEURON_HARDWARE" in line and "trn2" in line
