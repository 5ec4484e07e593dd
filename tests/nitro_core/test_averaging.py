"""Averaging checkpoints: the streaming float64 mean, layer state, EMA, refusals, export."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from nitro_core import (
    Average,
    Best,
    Checkpointer,
    CheckpointNotFound,
    ConfigError,
    EarlyStopping,
    Last,
    Nitro,
    NitroWarning,
    ResumeRefused,
    TrainingRefused,
    average_checkpoints,
    checkpoint_info,
    export_weights,
    read_manifest,
)
from nitro_core.averaging import write_averaged
from nitro_core.examples import Classifier, Regression


class KeepMany(Classifier):
    samples: int = 256

    def checkpointer(self):
        return Checkpointer(keep=(Best(3), Last(5)))


class Half(Regression):
    samples: int = 256
    dtype: str = "float16"

    def build_model(self):
        return super().build_model().to(getattr(torch, self.dtype))

    def loss(self, model, batch):
        x = batch["x"].to(getattr(torch, self.dtype))
        return torch.nn.functional.mse_loss(model(x).float(), batch["y"])

    def build_optimizer(self, model):
        return torch.optim.SGD(model.parameters(), lr=self.lr)

    def checkpointer(self):
        return Checkpointer(keep=Last(4))


def independent_mean(paths, key):
    """float64 mean computed straight from the files, in order."""
    total = None
    for p in paths:
        with safe_open(str(p), framework="pt") as f:
            t = f.get_tensor(key).to(torch.float64)
        total = t if total is None else total + t
    return total / len(paths)


@pytest.fixture
def run(tmp_path):
    n = Nitro(KeepMany(max_epochs=5), run_dir=tmp_path).train()
    return n, tmp_path


def test_average_equals_the_float64_mean_cast_back_and_counters_come_from_the_state_record(run):
    n, d = run
    result = average_checkpoints(d, "latest => Average(Last(3))")
    entries = read_manifest(d)[-3:]
    paths = [d / e.file for e in entries]
    assert result.averaged_from["files"] == [e.file for e in entries]
    assert (
        result.averaged_from["epochs"] == [3, 4, 5]
        and result.averaged_from["weights"] == [1 / 3] * 3
    )
    for key, value in result.state.items():
        if f"params/{key}" in safe_open(str(paths[0]), "pt").keys():
            expected = independent_mean(paths, f"params/{key}").to(value.dtype)
            assert torch.equal(value, expected), key
    state_record = load_file(paths[-1])  # Last ranks nothing: the latest supplies layer state
    for key in ("1.running_mean", "1.running_var", "1.num_batches_tracked"):
        assert torch.equal(result.state[key], state_record[f"buffers/{key}"]), key
    assert result.state["1.num_batches_tracked"].dtype == torch.int64


def test_best_selector_takes_layer_state_from_the_best_picked_record(run):
    n, d = run
    result = average_checkpoints(d, "latest => Average(Best(2; among=Last(5)))")
    picked = [e for e in read_manifest(d) if e.file in result.averaged_from["files"]]
    best = max(picked, key=lambda e: (e.score, -e.epoch))
    assert result.averaged_from["state_from"] == best.file
    forced = average_checkpoints(d, "latest => Average(Best(2; among=Last(5)), state=latest)")
    assert forced.averaged_from["state_from"] == picked[-1].file


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])  # numpy's add, and torch's
def test_a_half_precision_model_stays_in_its_dtype(tmp_path, dtype):
    Nitro(Half(max_epochs=4, dtype=dtype), run_dir=tmp_path).train()
    result = average_checkpoints(tmp_path, "latest => Average(Last(4))")
    paths = [tmp_path / e.file for e in read_manifest(tmp_path)]
    want = getattr(torch, dtype)
    for key, value in result.state.items():
        assert value.dtype == want
        assert torch.equal(value, independent_mean(paths, f"params/{key}").to(want)), key


def test_tied_weights_are_averaged_once_and_stay_tied(tmp_path):
    class Tied(Regression):
        samples: int = 128

        def build_model(self):
            model = torch.nn.Sequential(
                torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
            )
            model[1].weight = model[0].weight
            return model

        def checkpointer(self):
            return Checkpointer(keep=Last(2))

    Nitro(Tied(max_epochs=2), run_dir=tmp_path).train()
    result = average_checkpoints(tmp_path, "latest => Average(Last(2))")
    assert result.state["1.weight"] is result.state["0.weight"]
    n = Nitro(Tied(), run_dir=tmp_path, weights="latest => Average(Last(2))")
    assert n.model[1].weight is n.model[0].weight
    assert torch.equal(n.model[0].weight, result.state["0.weight"])


def test_weights_from_an_average_carry_averaged_from(run):
    n, d = run
    w = Nitro(KeepMany(), run_dir=d, weights="latest => Average(Last(3))")
    assert (
        w.averaged_from["spec"] == "latest => Average(Last(3))"
        and w.averaged_from["run"] == n.run_id
    )
    assert w.optimizer.state_dict()["state"] == {}


def test_load_ema_averages_the_emas(run):
    n, d = run
    result = average_checkpoints(d, "latest => Average(Last(2))")
    w = Nitro(KeepMany(), run_dir=d, weights="latest => Average(Last(2))", load_ema=True)
    paths = [d / e.file for e in read_manifest(d)[-2:]]
    assert torch.equal(w.model[0].weight, independent_mean(paths, "ema/0.weight").float())
    assert torch.equal(result.ema["0.weight"], w.model[0].weight)


def test_load_ema_refuses_when_a_picked_record_has_none(tmp_path):
    class NoEma(Regression):
        samples: int = 128

        def checkpointer(self):
            return Checkpointer(keep=Last(2))

    Nitro(NoEma(max_epochs=2), run_dir=tmp_path).train()
    first = read_manifest(tmp_path)[0]
    with pytest.raises(ConfigError) as exc:
        Nitro(NoEma(), run_dir=tmp_path, weights="latest => Average(Last(2))", load_ema=True)
    assert str(exc.value) == (
        f"load_ema=True, but {first.file!r} (epoch 1) keeps no EMA; every picked record must. "
        "Drop load_ema to average their parameters."
    )


def test_the_run_must_still_hold_what_is_asked_for(run):
    n, d = run
    kept = ", ".join(str(e.epoch) for e in read_manifest(d))
    with pytest.raises(CheckpointNotFound) as exc:
        average_checkpoints(d, "latest => Average(Last(10))")
    assert str(exc.value) == (
        f"Cannot average 'latest => Average(Last(10))' in {str(d)!r}: Last(10) needs 10 points "
        f"and the run passed 5 (run {n.run_id} holds epochs {kept}). Average fewer points, or "
        "train the run further."
    )
    with pytest.raises(CheckpointNotFound) as exc:
        average_checkpoints(d, "latest => Average(Epochs([2, 9]))")
    assert str(exc.value) == (
        f"Cannot average 'latest => Average(Epochs([2, 9]))' in {str(d)!r}: Epochs([2, 9]) names "
        f"epochs the run never reached (9; it ended at epoch 5) (run {n.run_id} holds epochs "
        f"{kept}). Average fewer points, or train the run further."
    )
    assert average_checkpoints(d, "latest => Average(Epochs(3:5))").averaged_from["epochs"] == [
        3,
        4,
        5,
    ]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "all => Average(Last(3))",
            "'all => Average(Last(3))': averaging across runs is planned, not yet supported. Average "
            "within one run: 'latest => Average(Last(3))' or '<run id> => Average(Last(3))'.",
        ),
        (
            "latest => best",
            "average_checkpoints needs an Average, got 'latest => best'; write e.g. 'latest => Average(Last(10))'.",
        ),
    ],
)
def test_average_refusals_say_what_to_write(run, source, message):
    with pytest.raises(ConfigError) as exc:
        average_checkpoints(run[1], source)
    assert str(exc.value) == message


def test_saved_average_is_an_ordinary_record_outside_the_manifest(run):
    n, d = run
    before = read_manifest(d)
    out = d / "avg3.safetensors"
    average_checkpoints(d, "latest => Average(Last(3))", save=out)
    assert read_manifest(d) == before
    info = checkpoint_info(out)
    assert (
        info["averaged_from"]["files"] == [e.file for e in before[-3:]]
        and info["optimizer"] is None
    )
    with pytest.raises(ConfigError, match="already exists; Nitro never overwrites it"):
        average_checkpoints(d, "latest => Average(Last(3))", save=out)
    w = Nitro(KeepMany(), run_dir=d, weights=str(out))
    assert w.averaged_from == info["averaged_from"] and w.checkpoint_source == out
    with pytest.raises(
        ResumeRefused, match="it holds weights only, no optimizer state, step or RNG"
    ):
        Nitro(KeepMany(), run_dir=d, resume=str(out))
    Nitro(KeepMany(max_epochs=7), run_dir=d, resume="auto").train()  # retention runs again
    assert out.exists()


def test_a_saved_average_carries_no_metrics_but_its_own(run):
    # the header comes from the record that supplies the layer state: its metrics are that
    # record's, not the average's, and must not be carried over
    n, d = run
    latest = checkpoint_info(d / read_manifest(d)[-1].file)["metrics"]
    assert latest  # the state record was validated
    average_checkpoints(d, "latest => Average(Last(3))", save=d / "plain.safetensors")
    assert checkpoint_info(d / "plain.safetensors")["metrics"] == {}
    result = average_checkpoints(d, "latest => Average(Last(3))")
    write_averaged(result, d / "validated.safetensors", {"acc": 0.7633})
    assert checkpoint_info(d / "validated.safetensors")["metrics"] == {"acc": 0.7633}


def test_restore_best_average_ends_holding_the_runs_own_average(tmp_path):
    n = Nitro(KeepMany(max_epochs=5), run_dir=tmp_path, restore_best=Average(Last(3))).train()
    expected = average_checkpoints(tmp_path, f"{n.run_id} => Average(Last(3))")
    for k, v in n.model.state_dict().items():
        assert torch.equal(v, expected.state[k]), k
    for k in n.ema.shadow:
        assert torch.equal(n.ema.shadow[k], expected.ema[k]), k
    assert n.averaged_from["epochs"] == [3, 4, 5]
    with pytest.raises(TrainingRefused, match=r"holding run .*'s average Average\(Last\(3\)\)"):
        n.train()


def test_restore_best_average_refuses_a_keep_that_cannot_hold_it(tmp_path):
    with pytest.raises(ConfigError) as exc:
        Nitro(KeepMany(max_epochs=12), run_dir=tmp_path, restore_best="Average(Last(10))")
    assert str(exc.value) == (
        "restore_best=Average(Last(10)) needs records that keep=(Best(3), Last(5)) does not hold at "
        "the end of training (max_epochs=12). Keep them: "
        "Checkpointer(keep=(Best(3), Last(5), Last(10)))."
    )


def test_restore_best_average_after_an_early_stop_warns_and_keeps_the_final_weights(tmp_path):
    class Stops(KeepMany):
        lr: float = 0.0

        def early_stopping(self):
            return EarlyStopping(patience=1)

    n = Nitro(Stops(max_epochs=9), run_dir=tmp_path, restore_best=Average(Last(5)))
    with pytest.warns(
        NitroWarning,
        match=r"restore_best=Average\(Last\(5\)\): run .* ended before it held enough checkpoints",
    ):
        n.train()
    assert n.stop_reason == "early_stop" and n.averaged_from is None


def test_export_weights_loads_with_plain_safetensors_and_carries_provenance(run, tmp_path):
    n, d = run
    out = tmp_path / "export" / "w.safetensors"
    export_weights("latest => Average(Last(3))", out, run_dir=d)
    model = KeepMany().build_model()
    model.load_state_dict(load_file(out))
    expected = average_checkpoints(d, "latest => Average(Last(3))").state
    for k, v in model.state_dict().items():
        assert torch.equal(v, expected[k]), k
    with safe_open(str(out), framework="pt") as f:
        provenance = json.loads(f.metadata()["nitro"])
    assert provenance["averaged_from"]["epochs"] == [3, 4, 5]
    assert provenance["config"]["samples"] == 256 and provenance["seed"] == 0
    assert provenance["framework_version"] == "0.1.0" and provenance["source_file"].endswith(
        ".safetensors"
    )
    handle_out = tmp_path / "handle.safetensors"
    export_weights(n, handle_out)
    assert set(load_file(handle_out)) == set(n.model.state_dict())
    with pytest.raises(ConfigError, match="already exists"):
        export_weights(n, handle_out)


def test_a_handle_loaded_from_an_average_exports_its_provenance(run, tmp_path):
    n, d = run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = Nitro(KeepMany(), run_dir=d, weights="latest => Average(Last(2))")
    out = tmp_path / "w.safetensors"
    export_weights(w, out)
    assert checkpoint_info(out)["averaged_from"] == w.averaged_from


def test_streams_that_disagree_on_the_tensor_are_refused_not_added():
    from nitro_core import CheckpointCorrupt
    from nitro_core.averaging import _lockstep
    from nitro_core.store.record_header import Tensor

    def stream(*names):
        for name in names:
            yield Tensor(name, torch.float32, (2,), 0, 8, "params"), 0, torch.ones(2)

    with pytest.raises(CheckpointCorrupt) as exc:
        list(_lockstep([stream("params/a", "params/b"), stream("params/b", "params/a")]))
    assert str(exc.value) == (
        "The records picked yield 'params/a' beside ['params/b']: they do not share one "
        "layout. Average records of one run and one kind."
    )


def test_an_average_prints_what_it_is_not_its_tensors(tmp_path):
    """``print(average_checkpoints(...))`` once dumped every tensor (issue 38)."""
    from nitro_core import Nitro, average_checkpoints
    from nitro_core.examples import Regression

    run = tmp_path / "runs/r"
    n = Nitro(Regression(max_epochs=3, samples=64), run_dir=run).train()
    avg = average_checkpoints(run, "latest => Average(Last(2))")
    assert repr(avg) == (
        f"Averaged(4 tensors, 321 parameters, float32; epochs [2, 3] of run {n.run_id} in "
        f"{str(run)!r}; ema: no)"
    )
    assert "tensor(" not in str(avg)
    n.close()
