"""What starts without torch: the read-only commands (``nitro runs``, ``manifest``,
``info``, ``verify``) read manifests and record headers and hash record bytes with no torch
in the process; torch loads with the first tensor read. (``nitro serve`` answering
``initialize`` and ``tools/list`` before torch: tests/nitro_mcp/test_transports.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from nitro_core import Nitro, read_manifest
from nitro_core.examples import Regression
from nitro_core.store.record_header import ITEMSIZE, Tensor
from nitro_core.store.writer import DTYPES

# each command through the CLI's own entry point, then whether torch came in
READ_ONLY = """
import contextlib, io, json, sys
from nitro_mcp.cli import main
run_dir, record = sys.argv[1], sys.argv[2]
codes = {}
for argv in (["runs", run_dir], ["manifest", run_dir], ["info", record], ["verify", run_dir]):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        codes[argv[0]] = main(argv)
    codes[argv[0] + " out"] = out.getvalue()[-300:]
codes["torch before a read"] = "torch" in sys.modules
from nitro_core.store.reader import RecordFile
with RecordFile(record) as f:
    f.read(["params"])
codes["torch after a read"] = "torch" in sys.modules
print(json.dumps(codes))
"""


def test_the_read_only_commands_run_without_torch_and_a_tensor_read_loads_it(tmp_path):
    run_dir = tmp_path / "run"
    Nitro(Regression(max_epochs=2, samples=64), run_dir=run_dir).train()
    record = run_dir / read_manifest(run_dir)[-1].file
    done = subprocess.run([sys.executable, "-c", READ_ONLY, str(run_dir), str(record)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    codes = json.loads(done.stdout)
    assert {k: codes[k] for k in ("runs", "manifest", "info", "verify")} == dict.fromkeys(
        ("runs", "manifest", "info", "verify"), 0
    ), codes
    assert "2 record(s) checked, 0 corrupt" in done.stderr + codes["verify out"], codes
    assert codes["torch before a read"] is False, codes
    assert codes["torch after a read"] is True  # the check above can see torch come in


def test_the_header_reader_knows_each_dtype_the_writer_stores_as_torch_does():
    assert set(ITEMSIZE) == set(DTYPES.values())
    for dtype, code in DTYPES.items():
        assert ITEMSIZE[code] == dtype.itemsize, code
        assert Tensor("t", code, (2,), 0, 2 * ITEMSIZE[code], "params").dtype is dtype
    assert Tensor("t", "BF16", (3,), 0, 6, "params").itemsize == torch.bfloat16.itemsize
