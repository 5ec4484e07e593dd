"""Naming, resuming from and loading checkpoints: resolution, refusals and branching."""

from __future__ import annotations

import warnings

import pytest
import torch

from nitro_core import (
    Best,
    Checkpointer,
    CheckpointNotFound,
    ConfigError,
    Last,
    Nitro,
    NitroWarning,
    NullLogger,
    ResumeRefused,
    TrainingRefused,
    read_manifest,
)
from nitro_core.examples import Classifier, Regression
from nitro_core.sources.grammar import parse_source
from nitro_core.sources.resolve import resolve
from nitro_core.store import recordio as store

from ..tiny import KeepLast, NoVal, Tiny, WithAcc


def quiet(**kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Nitro(**kwargs)


@pytest.fixture
def trained(tmp_path):
    """A Regression run of 4 epochs keeping everything, in tmp_path/reg."""

    class KeepAll(Regression):
        samples: int = 256

        def checkpointer(self):
            return Checkpointer(keep=(Best(2), Last(4)))

    n = Nitro(KeepAll(max_epochs=4), run_dir=tmp_path / "reg").train()
    return n, KeepAll


# -- resolution --------------------------------------------------------------------------------
def test_latest_and_best_resolve_from_the_manifest(trained):
    n, _ = trained
    entries = read_manifest(n.run_dir)
    assert resolve(parse_source("latest => latest"), n.run_dir, entries).entry == entries[-1]
    best = resolve(parse_source(f"{n.run_id} => best"), n.run_dir, entries).entry
    assert best.score == min(e.score for e in entries)
    assert resolve(parse_source("all => best"), n.run_dir, entries).entry == best


def test_all_latest_is_refused_with_the_pair_to_write(trained):
    n, exp = trained
    with pytest.raises(ConfigError) as exc:
        Nitro(exp(), run_dir=n.run_dir, weights="all => latest")
    assert str(exc.value) == (
        "'all => latest' names no single checkpoint: every run has its own latest. Write "
        "'latest => latest' (the run that wrote last) or '<run id> => latest'."
    )


def test_an_unknown_run_names_the_directory_and_its_runs(trained):
    n, exp = trained
    with pytest.raises(CheckpointNotFound) as exc:
        Nitro(exp(), run_dir=n.run_dir, weights="deadbeef => best")
    assert str(exc.value) == (
        f"No run 'deadbeef' in {str(n.run_dir)!r}; it holds runs {n.run_id} (4 entries, epochs 1, 2, 3, 4). "
        "Write one of those run ids, or 'latest => best'."
    )


def test_weights_from_an_empty_directory_raise_instead_of_fresh_weights(tmp_path):
    with pytest.raises(CheckpointNotFound) as exc:
        Nitro(Tiny(), run_dir=tmp_path / "none", weights="latest => best")
    assert str(exc.value) == (
        f"No checkpoint matches 'latest => best' in {str(tmp_path / 'none')!r}: it holds no "
        "checkpoints (no manifest entries). Train a run there first, or name a record file by its path."
    )


def test_a_missing_path_names_where_it_looked(trained):
    n, exp = trained
    with pytest.raises(
        CheckpointNotFound,
        match=r"Checkpoint file 'nope.safetensors' not found \(looked at 'nope.safetensors' and",
    ):
        Nitro(exp(), run_dir=n.run_dir, weights="nope.safetensors")


def test_best_under_a_metric_the_run_never_scored_explains_what_it_has(trained):
    n, _ = trained

    class RankByAcc(WithAcc):
        width: int = 8

    with pytest.raises(CheckpointNotFound) as exc:
        quiet(experiment=RankByAcc(), run_dir=n.run_dir, weights="latest => best")
    assert str(exc.value) == (
        f"No checkpoint matches 'latest => best' in {str(n.run_dir)!r}: run {n.run_id} has no entry "
        "scored by acc (max); it has loss (min) x4. Write Checkpointer(metric='loss', mode='min') "
        "or rank by acc in a new run."
    )


def test_best_over_mixed_metrics_warns(tmp_path):
    class LossDir(KeepLast):
        pass

    Nitro(KeepLast(max_epochs=1), run_dir=tmp_path).train()
    Nitro(WithAcc(max_epochs=1), run_dir=tmp_path).train()
    with pytest.warns(
        NitroWarning,
        match=r"'all => best' ranks only entries scored by loss \(min\); .* also holds acc \(max\) x1",
    ):
        Nitro(LossDir(max_epochs=1), run_dir=tmp_path, weights="all => best")


# -- weights ----------------------------------------------------------------------------------
def test_weights_start_a_new_run_with_a_fresh_optimizer(trained):
    n, exp = trained
    best = min(read_manifest(n.run_dir), key=lambda e: e.score)
    w = Nitro(exp(), run_dir=n.run_dir, weights="latest => best")
    assert w.run_id != n.run_id and (w.step, w.epoch, w.history) == (0, 0, [])
    assert w.checkpoint_source == n.run_dir / best.file
    assert w.optimizer.state_dict()["state"] == {}
    tensors, _ = store.read_record(n.run_dir / best.file)
    for k, v in w.model.state_dict().items():
        assert torch.equal(v, tensors[f"params/{k}"]), k


def test_weights_under_a_changed_config_only_warn(trained):
    n, exp = trained
    with pytest.warns(NitroWarning, match=r"trained under another config:\n  lr: 0.01 -> 0.5\n"):
        Nitro(exp(lr=0.5), run_dir=n.run_dir, weights="latest => latest")


def test_a_parameter_tree_that_does_not_fit_names_the_leaf_and_both_sizes(trained):
    n, exp = trained
    (path,) = [n.run_dir / e.file for e in read_manifest(n.run_dir)[-1:]]
    for strict in (True, False):
        with pytest.raises(ConfigError) as exc:
            quiet(
                experiment=exp(hidden=16),
                run_dir=n.run_dir,
                weights="latest => latest",
                strict=strict,
            )
        assert str(exc.value) == (
            f"Checkpoint {str(path)!r} does not fit KeepAll's model: leaf '0.weight' has size [32, 8] "
            "in the record and [16, 8] in the model. Build the model the record was written with "
            "(same config), or train a new run."
        )


def test_strict_false_loads_by_name_and_warns_about_the_rest(tmp_path):
    class Two(Tiny):
        def build_model(self):
            return torch.nn.ModuleDict(
                {"a": torch.nn.Linear(self.width, 1), "b": torch.nn.Linear(1, 1)}
            )

        def loss(self, model, batch):
            return torch.nn.functional.mse_loss(model["b"](model["a"](batch["x"])), batch["y"])

    class Three(Two):
        def build_model(self):
            return torch.nn.ModuleDict(
                {"a": torch.nn.Linear(self.width, 1), "c": torch.nn.Linear(1, 1)}
            )

    src = Nitro(Two(max_epochs=1), run_dir=tmp_path).train()
    with pytest.raises(
        ConfigError,
        match=r"the record lacks 'c.weight', 'c.bias' and it has 'b.weight', 'b.bias' that the model lacks",
    ):
        Nitro(Three(), run_dir=tmp_path, weights="latest => latest")
    with pytest.warns(NitroWarning) as caught:
        n = Nitro(Three(), run_dir=tmp_path, weights="latest => latest", strict=False)
    messages = [str(w.message) for w in caught]
    assert any(
        m.startswith("strict=False: 'c.weight', 'c.bias' not in")
        and m.endswith("they keep their fresh values.")
        for m in messages
    )
    assert any(
        m.startswith("strict=False: 'b.weight', 'b.bias' in")
        and m.endswith("match no leaf of the model; dropped.")
        for m in messages
    )
    assert torch.equal(n.model["a"].weight, src.model["a"].weight)


def test_restore_optimizer_takes_the_state_under_a_fresh_schedule(trained):
    n, exp = trained
    w = Nitro(exp(lr=0.05), run_dir=n.run_dir, weights="latest => latest", restore_optimizer=True)
    last = n.optimizer.state_dict()
    mine = w.optimizer.state_dict()
    assert mine["param_groups"][0]["lr"] == 0.05 and w.step == 0
    for i, s in last["state"].items():
        for k, v in s.items():
            assert torch.equal(v, mine["state"][i][k]), (i, k)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"restore_optimizer": True},
            "restore_optimizer=True needs weights=...: it takes the optimizer state of the checkpoint "
            "weights= names. Write Nitro(exp, weights='latest => best', restore_optimizer=True), or "
            "resume='latest => latest' to continue exactly.",
        ),
        (
            {"restore_optimizer": True, "resume": "auto"},
            "restore_optimizer=True is for weights=; a resume already restores the optimizer (and the "
            "step, schedule and RNG). Drop restore_optimizer.",
        ),
        (
            {"restore_optimizer": True, "weights": "latest => Average(Last(3))"},
            "restore_optimizer=True with weights='latest => Average(Last(3))': an average carries no "
            "optimizer state. Drop restore_optimizer, or load one record: weights='latest => best'.",
        ),
        (
            {"resume": "auto", "strict": False},
            "strict=False loads leaves by name, which cannot continue a run exactly. Drop strict=False "
            "to resume, or start a new run with weights=..., strict=False.",
        ),
        (
            {"resume": "auto", "weights": "latest => best"},
            "Give resume= to continue a run exactly, or weights= to start a new run from a checkpoint's "
            "parameters, not both.",
        ),
        (
            {"resume": "latest => Average(Last(3))"},
            "resume='latest => Average(Last(3))': an average carries no optimizer state to continue. "
            "Start a new run from it with weights='latest => Average(Last(3))', or resume a record: "
            "resume='latest => latest'.",
        ),
        (
            {"resume": True},
            "resume=True is ambiguous; write resume='auto' (the latest record, or a fresh run when there "
            "is none) or a source such as resume='latest => latest'.",
        ),
        (
            {"load_ema": True},
            "load_ema=True loads the EMA copy of the checkpoint weights= names; write Nitro(exp, "
            "weights='latest => best', load_ema=True). A resume restores the EMA as the EMA already.",
        ),
        (
            {"restore_best": "maybe"},
            "Cannot parse 'maybe': at position 0 expected true, false or Average(...), e.g. 'Average(Last(10))'.",
        ),
    ],
)
def test_keyword_combinations_that_cannot_work_are_refused(tmp_path, kwargs, message):
    with pytest.raises(ConfigError) as exc:
        Nitro(Tiny(), run_dir=tmp_path, **kwargs)
    assert str(exc.value) == message


def test_load_ema_loads_the_ema_copy(tmp_path):
    n = Nitro(Classifier(max_epochs=2, samples=256), run_dir=tmp_path).train()
    w = Nitro(Classifier(samples=256), run_dir=tmp_path, weights="latest => latest", load_ema=True)
    for k, v in n.ema.shadow.items():
        assert torch.equal(w.model.state_dict()[k], v), k
    with pytest.raises(ConfigError, match="keeps no EMA"):
        Nitro(
            Regression(),
            run_dir=tmp_path / "r",
            weights=_one_regression_record(tmp_path),
            load_ema=True,
        )


def _one_regression_record(tmp_path):
    Nitro(Regression(max_epochs=1, samples=128), run_dir=tmp_path / "r").train()
    return "latest => latest"


# -- resume: continue or branch ------------------------------------------------------------------
def test_resuming_an_earlier_record_branches_into_a_new_run_with_a_parent(trained):
    n, exp = trained
    entries = read_manifest(n.run_dir)
    second = next(e for e in entries if e.epoch == 2)
    with pytest.warns(NitroWarning, match="branches into a new run"):
        b = Nitro(exp(max_epochs=4), run_dir=n.run_dir, resume=second.file)
    assert b.run_id != n.run_id and (b.epoch, b.step) == (2, second.step)
    b.train()
    after = read_manifest(n.run_dir)
    assert [e for e in after if e.run == n.run_id] == [
        e for e in entries if e.file in {x.file for x in after}
    ]
    mine = [e for e in after if e.run == b.run_id]
    assert mine and {e.parent for e in mine} == {f"{n.run_id}/{second.file}"}
    assert all(f"-run-{b.run_id}" in e.file for e in mine)
    assert {e.file for e in entries if e.epoch > 2} <= {e.file for e in after}


def test_resuming_the_best_of_a_run_branches_and_says_so(trained):
    n, exp = trained
    entries = read_manifest(n.run_dir)
    best = min(entries, key=lambda e: e.score)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        b = Nitro(exp(max_epochs=4), run_dir=n.run_dir, resume=f"{n.run_id} => best")
    assert b.checkpoint_source == n.run_dir / best.file
    branched = best.epoch != 4
    assert (b.run_id != n.run_id) == branched
    assert any("branches into a new run" in str(w.message) for w in caught) == branched


def test_explicit_latest_latest_with_nothing_to_resume_raises(tmp_path):
    with pytest.raises(CheckpointNotFound) as exc:
        Nitro(Tiny(), run_dir=tmp_path, resume="latest => latest")
    assert str(exc.value) == (
        f"Nothing to resume in {str(tmp_path)!r} for resume='latest => latest': it holds no "
        "checkpoints. Use resume='auto' to start fresh when there is nothing to resume."
    )


def test_resuming_a_file_outside_the_manifest_branches(tmp_path):
    n = Nitro(KeepLast(max_epochs=2), run_dir=tmp_path / "a").train()
    last = read_manifest(tmp_path / "a")[-1]
    with pytest.warns(NitroWarning, match="branches into a new run"):
        b = Nitro(
            KeepLast(max_epochs=3), run_dir=tmp_path / "b", resume=str(tmp_path / "a" / last.file)
        )
    b.train()
    assert (
        b.run_id != n.run_id
        and read_manifest(tmp_path / "b")[-1].parent == f"{n.run_id}/{last.file}"
    )


# -- the four refusals ---------------------------------------------------------------------------
def test_a_moved_parameter_layout_refuses_with_a_diff(tmp_path):
    Nitro(KeepLast(max_epochs=1), run_dir=tmp_path).train()

    class Reordered(KeepLast):
        def build_optimizer(self, model):
            return torch.optim.AdamW(
                [{"params": [model.bias]}, {"params": [model.weight]}], lr=self.lr
            )

    Reordered.__name__ = "KeepLast"
    with pytest.raises(ResumeRefused) as exc:
        Nitro(Reordered(max_epochs=2), run_dir=tmp_path, resume="auto")
    assert (
        "the parameter layout moved since it was recorded, which would scramble the optimizer state"
        in str(exc.value)
    )
    assert "  optimizer groups: [['weight', 'bias']] -> [['bias'], ['weight']]" in str(exc.value)


def test_a_different_logger_backend_refuses(tmp_path):
    Nitro(KeepLast(max_epochs=1), run_dir=tmp_path).train()

    class Silent(KeepLast):
        def logger(self):
            return NullLogger()

    with pytest.raises(ResumeRefused) as exc:
        Nitro(Silent(max_epochs=2), run_dir=tmp_path, resume="auto")
    assert str(exc.value).endswith(
        "its logger state is for the 'jsonl' backend, this handle logs with 'null': a resume keeps "
        "the run's logger so that its logs continue without gaps or repeats. Write "
        "Nitro(..., logger='jsonl') (or, without logger=, return JSONLLogger() from "
        "Silent.logger()); or start a new run_dir."
    )


class Anchored(KeepLast):
    def build_optimizer(self, model):
        return torch.optim.AdamW(model.parameters(), lr=self.lr, weight_decay=0.1)

    def decay_anchor(self):
        return "w0"


def test_w0_anchor_resumes_exactly_and_refuses_a_changed_initialization(tmp_path):
    a = Nitro(Anchored(max_epochs=3), run_dir=tmp_path / "a").train()
    Nitro(Anchored(max_epochs=1), run_dir=tmp_path / "b").train()
    c = Nitro(Anchored(max_epochs=3), run_dir=tmp_path / "b", resume="auto").train()
    assert torch.equal(a.model.weight, c.model.weight)

    class Reinit(Anchored):
        def build_model(self):
            model = super().build_model()
            torch.nn.init.zeros_(model.weight)
            return model

    Reinit.__name__ = "Anchored"
    with pytest.raises(
        ResumeRefused,
        match=r"its decay anchor w0 has checksum [0-9a-f]{12}\.\.\., but build_model\(\) with seed 0 now builds initial weights with checksum",
    ):
        Nitro(Reinit(max_epochs=4), run_dir=tmp_path / "b", resume="auto")


def test_w0_anchor_pulls_toward_the_initial_weights_not_zero(tmp_path):
    class Idle(Anchored):
        lr: float = 0.1

        def loss(self, model, batch):
            return (model(batch["x"]) * 0).sum()

    n = Nitro(Idle(max_epochs=1), run_dir=tmp_path)
    w0 = n.model.weight.detach().clone()
    n.train()
    assert torch.allclose(n.model.weight, w0)


# -- restore_best -------------------------------------------------------------------------------
def test_restore_best_ends_holding_the_best_checkpoint_and_refuses_more_training(tmp_path):
    n = Nitro(Classifier(max_epochs=4, samples=256), run_dir=tmp_path, restore_best=True).train()
    own = read_manifest(tmp_path)
    best = max(own, key=lambda e: (e.score, -e.epoch))
    tensors, _ = store.read_record(tmp_path / best.file)
    for k, v in n.model.state_dict().items():
        assert torch.equal(
            v, tensors[f"params/{k}"] if f"params/{k}" in tensors else tensors[f"buffers/{k}"]
        ), k
    for k, v in n.ema.shadow.items():
        assert torch.equal(v, tensors[f"ema/{k}"]), k
    assert (n.epoch, len(n.history)) == (4, 4) and n.checkpoint_source == tmp_path / best.file
    with pytest.raises(TrainingRefused) as exc:
        n.train()
    where = f"run_dir={str(tmp_path)!r}"
    assert str(exc.value) == (
        f"This handle ended train() holding run {n.run_id}'s best checkpoint (epoch {best.epoch}, "
        f"acc={best.score:.6g}) rather than its final state (epoch 4); those weights beside the final "
        "optimizer state are not a state any run was in, so it will not train further. To continue "
        "from it, write one of:\n"
        f"  Nitro(Classifier(...), {where}, resume='{n.run_id} => best')  # exact: its optimizer, step and RNG, as a new branch\n"
        f"  Nitro(Classifier(...), {where}, weights='{n.run_id} => best')  # its weights, a fresh optimizer and schedule\n"
        f"  Nitro(Classifier(...), {where}, weights='{n.run_id} => best', restore_optimizer=True)  # its weights and optimizer state, a fresh schedule"
    )


def test_restore_best_without_a_scored_checkpoint_warns_and_keeps_the_final_weights(tmp_path):
    n = Nitro(NoVal(max_epochs=2), run_dir=tmp_path, restore_best=True)
    with pytest.warns(
        NitroWarning, match="has no scored checkpoint in .*, so the handle keeps its final weights"
    ):
        n.train()
    n.train()  # nothing was swapped in, so training may continue


# -- partial files ------------------------------------------------------------------------------
def test_a_partial_tmp_file_is_never_loaded_warned_about_and_moved_aside(tmp_path):
    Nitro(NoVal(max_epochs=1), run_dir=tmp_path).train()
    partial = tmp_path / "epoch-0002-step-8.safetensors.tmp"
    partial.write_bytes(b"half a record")
    with pytest.raises(ConfigError, match="is a partial file left by an interrupted write"):
        Nitro(NoVal(), run_dir=tmp_path, weights=partial)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        n = Nitro(NoVal(max_epochs=2), run_dir=tmp_path, resume="auto")
        n.train()
    messages = [str(w.message) for w in caught]
    assert any(
        "'epoch-0002-step-8.safetensors.tmp' in" in m
        and "is a partial file left by an interrupted write" in m
        for m in messages
    )
    assert any("moved it to 'epoch-0002-step-8.safetensors.tmp.stale'" in m for m in messages)
    assert (tmp_path / "epoch-0002-step-8.safetensors.tmp.stale").read_bytes() == b"half a record"
    assert read_manifest(tmp_path)[-1].file == "epoch-0002-step-8.safetensors"


def test_a_name_another_process_is_writing_is_not_taken(tmp_path):
    Nitro(NoVal(max_epochs=1), run_dir=tmp_path).train()
    busy = store.reserve(tmp_path / "epoch-0002-step-8.safetensors")  # a live writer's claim
    try:
        n = Nitro(NoVal(max_epochs=2), run_dir=tmp_path, resume="auto").train()
    finally:
        busy.release()
    assert read_manifest(tmp_path)[-1].file == f"epoch-0002-step-8-run-{n.run_id}.safetensors"
