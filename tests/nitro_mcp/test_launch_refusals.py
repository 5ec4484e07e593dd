"""What a record's header or the server's environment already says is refused at the call,
never launched to fail in the worker (where a failed job's ``next`` would only repeat the
call): ``load_ema=true`` on a record without an EMA section, ``weights='hf:<dir>'`` whose
tensors the experiment's model has none of (its leaves asked of a fork-server child, as
every record's fit is), ``logger='wandb'`` without W&B credentials, and a run directory the
server's jobs could not write in. Through the real server and an in-process MCP client."""

from __future__ import annotations

import json

import anyio
import pytest
import torch
from mcp import Client
from safetensors.torch import save_file

from nitro_core import Nitro, export_weights, read_manifest
from nitro_core.errors import ConfigError
from nitro_core.examples import Classifier, Regression
from nitro_mcp.call_checks import check_tracker_credentials
from nitro_mcp.record_fit import check_hf_fits
from nitro_mcp.server import build_server
from tests import unprivileged

from .conftest import call, wait_done

GPT2 = {  # a few tensors of a GPT-2 directory, as save_pretrained names them
    "transformer.wte.weight": [50, 8],
    "transformer.wpe.weight": [16, 8],
    "transformer.h.0.attn.c_attn.weight": [8, 24],
    "transformer.h.0.attn.c_attn.bias": [24],
    "transformer.ln_f.weight": [8],
}
WANDB = (
    "WANDB_API_KEY", "WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL", "NETRC",
    "WANDB_CONFIG_DIR", "WANDB_DIR",
)  # fmt: skip


def _hf_dir(path, shapes):
    """A Hugging Face directory holding zero tensors of ``shapes`` (name -> shape)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    save_file({k: torch.zeros(v) for k, v in shapes.items()}, str(path / "model.safetensors"))


def _jobs(root):
    jobs = root / ".nitro" / "jobs"
    return sorted(p.name for p in jobs.iterdir()) if jobs.is_dir() else []


def _refusals(root, calls):
    async def go():
        async with Client(build_server(root)) as client:
            return [await call(client, tool, **args) for tool, args in calls]

    return anyio.run(go)


def test_load_ema_on_a_record_without_an_ema_section_is_refused_at_the_call(tmp_path):
    root = tmp_path / "root"
    Nitro(Regression(max_epochs=1, samples=64), run_dir=root / "runs" / "Regression").train()
    (record,) = read_manifest(root / "runs" / "Regression")
    export_weights(f"{root}/runs/Regression/{record.file}", root / "exports" / "w.safetensors")
    replies = _refusals(root, [
        ("nitro_validate", {"experiment": "Regression", "load_ema": True}),
        ("nitro_validate", {"experiment": "Regression", "run_dir": "runs/Regression",
                            "weights": "exports/w.safetensors", "load_ema": True}),
    ])  # fmt: skip
    assert _jobs(root) == [], replies  # nothing was launched
    (err, text), (err2, export) = replies
    assert err and text.endswith(
        f"load_ema=true evaluates the EMA copy of the weights, but 'runs/Regression/{record.file}' "
        "keeps no EMA (Regression.ema() returned None when it was written). Drop load_ema to "
        "evaluate its parameters: nitro_validate(experiment='Regression', "
        "run_dir='runs/Regression', weights='latest => best')."
    ), text
    assert err2 and export.endswith(
        "load_ema=true evaluates the EMA copy of the weights, but 'exports/w.safetensors' keeps "
        "no EMA (an export holds the parameters alone). Drop load_ema to evaluate its "
        "parameters: nitro_validate(experiment='Regression', run_dir='runs/Regression', "
        "weights='exports/w.safetensors')."
    ), export


def test_load_ema_on_a_record_with_an_ema_section_is_evaluated(trained_root):
    root, _ = trained_root  # Classifier keeps an EMA

    async def go():
        async with Client(build_server(root)) as client:
            err, job = await call(client, "nitro_validate", experiment="Classifier",
                                  load_ema=True)  # fmt: skip
            assert not err, job
            return await wait_done(client, job["job_id"])

    status = anyio.run(go)
    assert status["state"] == "succeeded", status
    assert set(status["result"]["metrics"]) == {"acc", "loss"}, status


def test_an_hf_directory_the_model_has_no_leaf_of_is_refused_at_the_call(tmp_path):
    root = tmp_path / "root"
    _hf_dir(root / "models" / "gpt2", GPT2)
    replies = _refusals(root, [
        ("nitro_train", {"experiment": "Classifier", "weights": "hf:models/gpt2"}),
        ("nitro_train", {"experiment": "Classifier", "weights": "hf:models/gpt2",
                         "strict": False, "seed": 3}),
    ])  # fmt: skip
    assert _jobs(root) == [], replies  # nothing was launched
    said = (
        "weights='hf:models/gpt2' does not fit Classifier's model: none of the 5 tensors the "
        "directory holds ('transformer.h.0.attn.c_attn.bias', 'transformer.h.0.attn.c_attn.weight', "
        "'transformer.ln_f.weight', 'transformer.wpe.weight' and 1 more) is a leaf of the model "
        "('0.bias', '0.weight', '1.bias', '1.num_batches_tracked' and 5 more), so nothing of it "
        "would load, with strict=false either. Send weights= a directory of the model "
        "Classifier.build_model() builds, or train from fresh weights: "
    )
    (err, strict), (err2, lenient) = replies
    fresh = "nitro_train(experiment='Classifier', run_dir='runs/Classifier'"
    assert err and strict.endswith(said + fresh + ")."), strict
    assert err2 and lenient.endswith(said + fresh + ", seed=3)."), lenient


MODEL = {k: list(v.shape) for k, v in Classifier().build_model().state_dict().items()}


@pytest.mark.parametrize(
    ("held", "strict", "refusal"),
    [
        (MODEL, True, None),
        ({k: v for k, v in MODEL.items() if k != "4.weight"}, True, None),  # maybe a tied alias
        ({**MODEL, "4.weight": [5, 64]}, False,
         "Checkpoint 'hf:m' does not fit Classifier's model: leaf '4.weight' has size [5, 64] in "
         "the record and [4, 64] in the model."),
        ({**MODEL, "head.weight": [4]}, True,
         "Checkpoint 'hf:m' does not fit Classifier's model: it has 'head.weight' that the model "
         "lacks."),
        ({**MODEL, "head.weight": [4]}, False, None),
    ],
)  # fmt: skip
def test_an_hf_directory_is_held_to_what_it_holds_a_leaf_it_lacks_may_be_a_tied_alias(
    tmp_path, held, strict, refusal
):
    _hf_dir(tmp_path / "m", held)
    args = {"experiment": "Classifier", "weights": "hf:m", "strict": strict}

    def fits():
        check_hf_fits(Classifier(), tmp_path / "m", strict, "hf:m", "nitro_train", args,
                      lambda exp: MODEL)  # fmt: skip

    if refusal is None:
        fits()
        return
    with pytest.raises(ConfigError) as caught:
        fits()
    assert str(caught.value).startswith(refusal), str(caught.value)


def test_logger_wandb_without_credentials_is_refused_at_the_call(tmp_path, monkeypatch):
    pytest.importorskip("wandb")  # else refused first as a package this server lacks
    for name in WANDB:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    root = tmp_path / "root"
    replies = _refusals(root, [
        ("nitro_train", {"experiment": "Classifier", "logger": "wandb"}),
        ("nitro_train", {"experiment": "Classifier", "logger": "wandb", "seed": 1}),
    ])  # fmt: skip
    monkeypatch.setenv("WANDB_MODE", "online")
    ((err, text),) = _refusals(root, [("nitro_train", {"experiment": "Classifier",
                                                       "logger": "wandb"})])  # fmt: skip
    assert _jobs(root) == [], replies  # nothing was launched
    netrc = tmp_path / "home" / ".netrc"
    said = (
        "logger='wandb' needs W&B credentials where the server runs, and it has none: no "
        f"WANDB_API_KEY, no entry for api.wandb.ai in '{netrc}', and {{mode}} (offline or "
        "disabled would need none). Set WANDB_API_KEY (or run wandb login) there, or "
        "WANDB_MODE=offline to keep the W&B run in files, and restart the server; or send "
        "logger='jsonl': nitro_train(experiment='Classifier', run_dir='runs/Classifier', "
        "{seed}logger='jsonl')."
    )
    (err1, first), (err2, seeded) = replies
    assert err1 and first.endswith(said.format(mode="no WANDB_MODE", seed="")), first
    assert err2 and seeded.endswith(said.format(mode="no WANDB_MODE", seed="seed=1, ")), seeded
    assert err and text.endswith(said.format(mode="mode 'online'", seed="")), text


NETRC = "home/.netrc"
SETTINGS = "home/.config/wandb/settings"  # W&B's global settings file
WORKSPACE = "root/wandb/settings"  # the settings file of the jobs' working directory


@pytest.mark.parametrize(
    ("environ", "files", "refused"),
    [
        ({}, {}, True),
        ({"WANDB_MODE": "offline"}, {}, False),
        ({"WANDB_MODE": "disabled"}, {}, False),
        ({"WANDB_MODE": "online"}, {}, True),
        ({"WANDB_API_KEY": "k" * 40}, {}, False),
        ({"WANDB_IDENTITY_TOKEN_FILE": "/run/token"}, {}, False),
        ({}, {NETRC: "machine api.wandb.ai login user password k\n"}, False),
        ({}, {NETRC: "machine example.org login user password k\n"}, True),  # another host's
        ({"WANDB_BASE_URL": "https://wandb.example.org"},
         {NETRC: "machine wandb.example.org login user password k\n"}, False),
        ({}, {NETRC: "machine api.wandb.ai login user\n"}, True),  # no password: no API key
        ({}, {NETRC: "machine api.wandb.ai login user password k\nmacdef"}, True),  # unparsed
        ({}, {SETTINGS: "[default]\nmode = offline\n"}, False),
        ({"WANDB_MODE": "online"}, {SETTINGS: "[default]\nmode = offline\n"}, True),
        ({}, {WORKSPACE: "[default]\napi_key = k\n"}, False),
        ({}, {SETTINGS: "[default]\nbase_url = https://wandb.example.org\n",
              NETRC: "machine wandb.example.org login user password k\n"}, False),
        ({}, {SETTINGS: "[default]\nbase_url = https://wandb.example.org\n",
              NETRC: "machine api.wandb.ai login user password k\n"}, True),
        ({}, {SETTINGS: "mode = offline\n"}, False),  # no section: left to the job's setup
    ],
)  # fmt: skip
def test_wandb_credentials_are_read_where_wandb_reads_them(tmp_path, environ, files, refused):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o600)
    args = {"experiment": "Classifier", "logger": "wandb"}
    environ = {"HOME": str(tmp_path / "home"), **environ}
    root = tmp_path / "root"
    if not refused:
        check_tracker_credentials("wandb", args, root, environ)
        return
    with pytest.raises(ConfigError, match="logger='wandb' needs W&B credentials"):
        check_tracker_credentials("wandb", args, root, environ)
    check_tracker_credentials("jsonl", args, root, environ)  # only W&B logs in


SERVER = """
import anyio
from mcp import Client
from nitro_mcp.server import build_server
root = Path(sys.argv[2])
async def go():
    async with Client(build_server(root)) as client:
        replies = []
        for run_dir in (None, "runs/Regression/sub"):
            args = {"experiment": "Regression", **({"run_dir": run_dir} if run_dir else {})}
            reply = await client.call_tool("nitro_train", args)
            replies.append([reply.is_error, reply.content[0].text])
        return replies
print(json.dumps({"replies": anyio.run(go)}))
"""


def test_a_run_directory_the_jobs_could_not_write_in_is_refused_at_the_call(tmp_path):
    root = tmp_path / "root"
    runs = root / "runs"
    runs.mkdir(parents=True)
    runs.chmod(0o555)
    try:
        out = unprivileged.run(SERVER, runs, str(root))
    finally:
        runs.chmod(0o755)
    assert _jobs(root) == [], out  # nothing was launched
    said = (
        f"Error executing tool nitro_train: Cannot write in '{runs}': permission denied (Nitro "
        f"creates 'Regression' there). Make it writable (chmod u+w {runs}), or choose another "
        "run_dir."
    )
    assert out["replies"] == [[True, said], [True, said]], out
