"""Every bad call is answered at once with a tool error that says what to write instead,
and writes nothing outside the root (and starts no job)."""

from __future__ import annotations

import anyio
import pytest
from mcp import Client

from nitro_mcp.server import build_server

from .conftest import call

E = "Error executing tool {tool}: "

BAD_CALLS = [
    ("nitro_train", {"experiment": "Nope"},
     "Unknown experiment 'Nope'; registered experiments are: CausalLM, Classifier, HFCausalLM, Regression. Use one of those names, or "
     "register yours with the 'nitro.experiments' entry-point group or --experiment-module when starting the server."),
    ("nitro_train", {"experiment": "os.system"},
     "Unknown experiment 'os.system'; registered experiments are: CausalLM, Classifier, HFCausalLM, Regression. Use one of those names, or "
     "register yours with the 'nitro.experiments' entry-point group or --experiment-module when starting the server."),
    ("nitro_train", {"experiment": "Regression", "overrides": {"hiden": 3}},
     "Regression: unknown field 'hiden'; Regression has the fields: max_epochs, features, hidden, samples, batch_size, "
     "lr. Send overrides naming only those fields, e.g. overrides={\"hidden\": ...}; nitro_experiments lists "
     "Regression's fields."),
    ("nitro_train", {"experiment": "Regression", "overrides": {"hidden": "wide"}},
     "Regression: field 'hidden' expects int, got 'wide' (str): Input should be a valid integer. Send "
     "overrides={\"hidden\": <int>} with a value that fits; nitro_experiments lists Regression's fields."),
    ("nitro_train", {"experiment": "Regression", "run_dir": "../outside"}, None),
    ("nitro_train", {"experiment": "Regression", "run_dir": "/etc"}, None),
    ("nitro_train", {"experiment": "Regression", "run_dir": "escape/inner"}, None),
    ("nitro_train", {"experiment": "Regression", "weights": "latest => eval('1')"},
     "Cannot parse source \"latest => eval('1')\": at position 10 found 'eval', expected best, latest or Average(...). "
     "Write a pair such as 'latest => best' or 'latest => Average(Last(10))', or a record's path (a .safetensors file or a record directory)."),
    ("nitro_train", {"experiment": "Regression", "weights": "best"},
     "Source 'best' names a checkpoint but not the run it belongs to; write 'latest => best' (the latest run's best) "
     "or 'all => best' (the best of every run)."),
    ("nitro_train", {"experiment": "Regression", "weights": "latest => best"}, "No checkpoint matches 'latest => best' in"),
    ("nitro_train", {"experiment": "Regression", "resume": "__import__('os').system('x')"},
     "Cannot parse source \"__import__('os').system('x')\": at position 10 found '(', expected '=>'. Write a pair such "
     "as 'latest => best' or 'latest => Average(Last(10))', or a record's path (a .safetensors file or a record directory)."),
    ("nitro_train", {"experiment": "Regression", "restore_best": "Average(Last(0))"},
     "Cannot parse source 'Average(Last(0))': at position 13 found '0', expected a positive integer up to 100000 (the most records a selector picks). "
     "Write restore_best as true, false or an average such as 'Average(Last(10))'."),
    ("nitro_train", {"experiment": "Regression", "restore_optimizer": True},
     "restore_optimizer=true needs weights=...: it takes the optimizer state of the checkpoint weights= names. Write "
     "nitro_train(..., weights='latest => best', restore_optimizer=true), or resume='latest => latest' to continue "
     "exactly."),
    ("nitro_train", {"experiment": "Regression", "device": "tpu"}, "device='tpu' is not a device; write 'auto', 'cpu' or 'cuda:0'."),
    ("nitro_train", {"experiment": "Regression", "weights": "../../etc/x.safetensors"}, None),
    ("nitro_validate", {"experiment": "Regression", "weights": "latest =>"},
     "Cannot parse source 'latest =>': at position 9 found the end of the text, expected best, latest or Average(...). "
     "Write a pair such as 'latest => best' or 'latest => Average(Last(10))', or a record's path (a .safetensors file or a record directory)."),
    ("nitro_validate", {"experiment": "Regression", "wait_s": 500}, "wait_s=500 is out of range; give 0 to 60 seconds."),
    ("average", {"run_dir": "../x"}, None),
    ("average", {"run_dir": "runs/none", "source": "all => Average(Last(3))"},
     "'all => Average(Last(3))': averaging across runs is planned, not yet supported. Average within one run: "
     "'latest => Average(Last(3))' or '<run id> => Average(Last(3))'."),
    ("average", {"run_dir": "runs/none", "source": "latest => best"},
     "source='latest => best' is not an average; write e.g. source='latest => Average(Last(10))'."),
    ("average", {"run_dir": "runs/none", "save": "/tmp/avg.safetensors"}, None),
    ("nitro_status", {"job_id": "20260101-000000-abcdef"}, "No job '20260101-000000-abcdef' under"),
    ("nitro_status", {"job_id": "../../etc"}, "job_id='../../etc' is not a job id; nitro_jobs lists them"),
    ("nitro_status", {"job_id": "x", "wait_s": 26}, "wait_s=26 is out of range; give 0 to 25 seconds."),
    ("nitro_status", {"job_id": "x", "wait_s": -1}, "wait_s=-1 is out of range; give 0 to 25 seconds."),
    ("nitro_stop", {"job_id": "20260101-000000-abcdef"}, "No job '20260101-000000-abcdef' under"),
    ("nitro_jobs", {"limit": 0}, "limit=0 is out of range; give 1 to 100."),
    ("nitro_jobs", {"cursor": "abc"}, "cursor='abc' is not a cursor; pass the next_cursor of the previous page."),
    ("nitro_runs", {"run_dir": "/"}, None),
    ("nitro_manifest", {"run_dir": "runs/none"}, "run_dir='runs/none' does not exist under the server's root"),
    ("nitro_checkpoint_info", {"path": "/etc/passwd"}, None),
    ("nitro_train", {"experiment": "Regression", "resum": "auto"},
     "unknown argument 'resum'; nitro_train takes: experiment, run_dir, resume, weights, restore_best, "
     "restore_optimizer, strict, seed, overrides, device"),
    ("nitro_train", {"experiment": "Regression", "seed": 2**80},
     "seed=1208925819614629174706176 is not a seed; write an integer from 0 to 2**63 - 1, e.g. seed=0."),
    ("nitro_train", {"experiment": "Classifier", "restore_best": "Average(Last(10))"},
     "restore_best=Average(Last(10)) can never be restored under keep=(Best(3), Last(3)): Last(10) needs 10 points and "
     "a run of max_epochs=6 passes at most 6 (one per epoch end), so the run would end keeping its final weights. "
     "Write restore_best=Average(Last(6)) or train for 10 epochs (max_epochs=10)."),
    ("nitro_train", {"experiment": "Classifier", "restore_best": "Average(Last(5))", "overrides": {"max_epochs": 12}},
     "restore_best=Average(Last(5)) needs records that keep=(Best(3), Last(3)) does not hold at the end of training "
     "(max_epochs=12). Keep them: Checkpointer(keep=(Best(3), Last(3), Last(5))) returned by the experiment's "
     "checkpointer() (a change to its module)."),
    ("average", {"run_dir": "runs/none", "save": "runs/avg"},
     "save='runs/avg' must name a .safetensors file, e.g. save='runs/Classifier/avg10.safetensors'."),
    ("nitro_jobs", {"cursor": "²"}, "cursor='²' is not a cursor; pass the next_cursor of the previous page."),
    ("nitro_checkpoint_info", {"path": "runs/none.safetensors"}, "path='runs/none.safetensors' is not a file under the server's root"),
    ("nitro_train", {"experiment": "Regression", "time_limit": 0},
     "time_limit=0 is not a time budget; send a positive number of seconds, e.g. time_limit=3600, or leave it out."),
    ("nitro_train", {"experiment": "Regression", "executor": "slurm", "nodes": 0},
     "nodes=0 is not a node count; send an integer from 1 to 1024, e.g. nodes=2 (with executor='slurm')."),
    ("nitro_train", {"experiment": "Regression", "executor": "slurm", "slurm": {"partition": "debug", "acount": "proj-7"}},
     "unknown argument 'slurm.acount'; slurm takes: partition, account, gres, qos, extra."),
    ("nitro_train", {"experiment": "Regression", "executor": "slurm", "slurm": {"extra": "--mem=16G"}},
     "slurm.extra='--mem=16G' is not a list; send e.g. slurm.extra=[]."),
    ("nitro_train", {"experiment": "Regression", "executor": "slurm", "slurm": {"extra": [16]}},
     "slurm.extra[0]=16 is not a string; send e.g. slurm.extra[0]='...'."),
    ("nitro_train", {"experiment": "Regression", "executor": "slurm", "slurm": "debug"},
     'slurm=\'debug\' is not an object; send e.g. slurm={"partition": "..."}.'),
]  # fmt: skip


def snapshot(directory):
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


@pytest.mark.parametrize(
    ("tool", "args", "message"),
    BAD_CALLS,
    ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(BAD_CALLS)],
)
def test_bad_calls_are_refused_at_once_with_what_to_write(tmp_path, tool, args, message):
    root = tmp_path / "root"
    root.mkdir()
    (root / "escape").symlink_to(tmp_path)  # a symlink pointing out of the root
    before_outside, before_root = snapshot(tmp_path), snapshot(root)

    async def main():
        async with Client(build_server(root)) as client:
            return await call(client, tool, **args)

    err, text = anyio.run(main)
    assert err, text
    prefix = E.format(tool=tool)
    assert text.startswith(prefix)
    if message is None:  # a path outside the root
        assert "outside the server's root" in text and "give a path inside it" in text
    else:
        assert text[len(prefix) :].startswith(message)
    assert snapshot(tmp_path) == before_outside
    assert not (root / ".nitro" / "jobs").exists() or not list((root / ".nitro" / "jobs").iterdir())
    assert snapshot(root) == before_root
