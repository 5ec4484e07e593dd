"""The training step real runs use (DESIGN.md section 9): precision, gradient accumulation,
norm clipping and torch.compile as experiment hooks; each resumes bit for bit, a resume
refuses a changed precision or accumulation, and records keep uncompiled parameter names."""

from __future__ import annotations

import functools
import math
import warnings

import pytest
import torch
from pydantic import PrivateAttr

from nitro_core import (
    ConfigError,
    Host,
    Nitro,
    NitroWarning,
    NonFiniteLoss,
    ResumeRefused,
    TensorBatches,
    read_manifest,
)
from nitro_core.examples import CausalLM
from nitro_core.state import records
from nitro_core.store import recordio
from nitro_core.training.resume import ResumePoint
from nitro_core.training.step import PRECISIONS, step_settings
from tests.nitro_core.training.test_resume import _train_epochs, assert_same_state

from ..tiny import Tiny


class Steps(Tiny):
    """Tiny through an MLP with dropout (the RNG matters), its step hooks set by Host fields
    so that a test can change one between a run and its resume. 4 batches an epoch."""

    prec: Host[str] = "32-true"
    accumulate: Host[int] = 1
    clip: Host[float | None] = None
    compiled: Host[bool] = False
    max_epochs: Host[int] = 4
    _dtypes: list[torch.dtype] = PrivateAttr(default_factory=list)

    def build_model(self):
        return torch.nn.Sequential(
            torch.nn.Linear(self.width, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1)
        )

    def loss(self, model, batch):
        out = model(batch["x"])
        self._dtypes.append(out.dtype)
        return torch.nn.functional.mse_loss(out.float(), batch["y"])

    def precision(self):
        return self.prec

    def accumulate_grad_batches(self):
        return self.accumulate

    def gradient_clip_val(self):
        return self.clip

    def compile(self):
        return self.compiled


class SGDSteps(Steps):
    """Plain SGD without dropout, so a step is exactly lr times the gradient it sees."""

    def build_model(self):
        return torch.nn.Linear(self.width, 1)

    def build_optimizer(self, model):
        return torch.optim.SGD(model.parameters(), lr=self.lr)


def assert_same_scaler(a: Nitro, c: Nitro) -> None:
    sa = a.stepper.scaler.state_dict() if a.stepper and a.stepper.scaler else None
    sc = c.stepper.scaler.state_dict() if c.stepper and c.stepper.scaler else None
    assert sa == sc


def a_equals_b_plus_c(tmp_path, exp: Steps, device: str = "cpu", **resume_changes) -> Nitro:
    """Run A trains 4 epochs; B trains 2 and stops; C resumes B to 4. Asserts A == C."""
    a = Nitro(exp, run_dir=tmp_path / "a", device=device).train()
    _train_epochs(Nitro(exp, run_dir=tmp_path / "b", device=device), 2)
    c = Nitro(
        exp.model_copy(update=resume_changes),
        run_dir=tmp_path / "b",
        resume="auto",
        device=device,
    )
    assert (c.epoch, c.step) == (2, a.step // 2)
    c.train()
    assert_same_state(a, c)
    assert_same_scaler(a, c)
    return a


# -- exact resume under each step hook ----------------------------------------------------------
@pytest.mark.parametrize(
    "hooks",
    [
        {"prec": "bf16-mixed"},
        {"prec": "16-mixed"},  # the GradScaler path; CPU autocast runs float16 in torch >= 2.4
        {"accumulate": 3},  # 4 batches an epoch: windows of 3 and 1
        {"clip": 0.05},
        {"prec": "bf16-mixed", "accumulate": 3, "clip": 0.05},
    ],
    ids=["bf16-mixed", "16-mixed", "accumulate-3", "clip", "all-three"],
)
def test_a_run_with_step_hooks_resumes_bit_for_bit(tmp_path, hooks):
    a = a_equals_b_plus_c(tmp_path, Steps(**hooks))
    steps_per_epoch = 2 if hooks.get("accumulate") == 3 else 4
    assert a.step == 4 * steps_per_epoch


def test_the_default_step_is_the_plain_one():
    n = Nitro(Steps(), device="cpu")
    assert n.stepper is None  # no autocast context, scaler or clipping on the default path
    assert n.model is n._forward_model


# -- what each hook does ------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_runs_the_forward_passes_under_autocast(precision):
    exp = Steps(prec=precision, max_epochs=1)
    Nitro(exp, device="cpu").train()
    dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float16
    # 4 training batches and 2 validation batches, all autocast
    assert exp._dtypes == [dtype] * 6


def test_32_true_runs_in_float32():
    exp = Steps(max_epochs=1)
    Nitro(exp, device="cpu").train()
    assert exp._dtypes == [torch.float32] * 6


def test_the_validation_loss_sums_in_fp32_when_the_loss_is_bfloat16():
    class Bf16Loss(Steps):
        def build_data(self):
            data = super().build_data()
            val = data["val"].tensors
            return {**data, "val": TensorBatches(val, 1)}  # 16 batches to sum

        def loss(self, model, batch):
            return super().loss(model, batch).to(torch.bfloat16)

    exp = Bf16Loss(prec="bf16-mixed")
    n = Nitro(exp, device="cpu")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        n.model.eval()
        rows = [(float(exp.loss(n.model, b)), len(b["y"])) for b in n.data["val"]]
    expected = sum(loss * k for loss, k in rows) / sum(k for _, k in rows)
    assert n.validate()["loss"] == pytest.approx(expected, rel=1e-6)


def _hand_sgd(exp: SGDSteps, windows: list[list[int]]) -> torch.nn.Module:
    """One SGD step per window of batch indices, on the mean of the window's losses."""
    torch.manual_seed(0)  # Nitro's draw order: data, model, then the epoch's shuffle
    data = exp.build_data()["train"]
    model = exp.build_model()
    batches = list(data)
    for window in windows:
        model.zero_grad()
        loss = sum(
            torch.nn.functional.mse_loss(model(batches[i]["x"]), batches[i]["y"]) for i in window
        )
        (loss / len(window)).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= exp.lr * p.grad
    return model


class Unsized:
    """A re-iterable split without a length."""

    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        return iter(self.inner)


class UnsizedSGDSteps(SGDSteps):
    def build_data(self):
        data = super().build_data()
        return {**data, "train": Unsized(data["train"])}


@pytest.mark.parametrize("kind", [SGDSteps, UnsizedSGDSteps], ids=["sized", "unsized"])
def test_accumulation_steps_on_the_mean_of_each_window_and_a_short_last_window_steps_too(kind):
    exp = kind(accumulate=3, max_epochs=1, lr=0.01)
    n = Nitro(exp, device="cpu").train()
    assert n.step == 2  # 4 batches: a window of 3, then the short window of the last batch
    hand = _hand_sgd(exp, [[0, 1, 2], [3]])
    for k, v in hand.state_dict().items():
        torch.testing.assert_close(n.model.state_dict()[k], v, rtol=1e-5, atol=1e-6)


def test_lr_scheduler_total_steps_counts_optimizer_steps():
    seen = []

    class Counted(Steps):
        def lr_scheduler(self, optimizer, total_steps):
            seen.append(total_steps)
            return torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.05, total_steps=total_steps)

    n = Nitro(Counted(accumulate=3, max_epochs=3), device="cpu").train()
    assert seen == [6] and n.step == 6  # OneCycleLR raises when stepped past total_steps


def test_clipping_bounds_the_gradient_norm_of_each_step():
    clip, lr = 0.01, 1.0
    exp = SGDSteps(clip=clip, lr=lr, max_epochs=1)
    n = Nitro(exp, device="cpu")
    before = [p.detach().clone() for p in n.model.parameters()]

    def moved(model: torch.nn.Module) -> float:
        return math.sqrt(
            sum(float((p.detach() - b).pow(2).sum()) for p, b in zip(model.parameters(), before))
        )

    n.train()
    # 4 SGD steps, each lr times a gradient of norm at most `clip`
    assert moved(n.model) <= 4 * lr * clip * (1 + 1e-4)
    free = Nitro(SGDSteps(lr=lr, max_epochs=1), device="cpu").train()  # same seed, same start
    assert moved(free.model) > 10 * moved(n.model)


def test_a_non_finite_loss_names_the_optimizer_step_under_accumulation():
    class NaNSecondEpoch(Steps):
        _calls: list[int] = PrivateAttr(default_factory=list)

        def loss(self, model, batch):
            if model.training:
                self._calls.append(1)
            loss = super().loss(model, batch)
            return loss * float("nan") if len(self._calls) == 5 else loss

    n = Nitro(NaNSecondEpoch(accumulate=3, max_epochs=3), device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NitroWarning)
        with pytest.raises(NonFiniteLoss) as exc:
            n.train()
    # epoch 1 took steps 1 and 2; batch 1 of epoch 2 is in step 3
    assert str(exc.value).startswith(
        "The training loss became non-finite at epoch 2, step 3 (batch 1 of the epoch): "
    )


# -- the GradScaler's state -------------------------------------------------------------------
def test_the_grad_scaler_state_is_in_the_record_and_restored_on_resume(tmp_path):
    exp = Steps(prec="16-mixed")
    b = _train_epochs(Nitro(exp, run_dir=tmp_path, device="cpu"), 2)
    written = b.stepper.scaler.state_dict()
    assert written["_growth_tracker"] > 0  # it has moved from a fresh scaler's state
    latest = sorted(tmp_path.glob("*.safetensors"))[-1]
    assert recordio.read_header(latest)["scaler"] == written  # plain JSON, no pickle
    c = Nitro(exp, run_dir=tmp_path, resume="auto", device="cpu")
    assert c.stepper.scaler.state_dict() == written
    fresh = Nitro(exp, run_dir=tmp_path / "fresh", device="cpu")
    assert fresh.stepper.scaler.state_dict() != written


def test_the_record_header_names_the_training_step(tmp_path):
    b = Nitro(Steps(prec="bf16-mixed", accumulate=2, clip=1, max_epochs=1), run_dir=tmp_path)
    b.train()
    meta = recordio.read_header(next(tmp_path.glob("*.safetensors")))
    assert meta["training_step"] == {
        "precision": "bf16-mixed",
        "accumulate_grad_batches": 2,
        "gradient_clip_val": 1.0,
        "compile": False,
    }
    assert "scaler" not in meta or meta["scaler"] is None


# -- resume refusals -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("recorded", "resumed", "lines", "wanted"),
    [
        (
            {},
            {"prec": "bf16-mixed"},
            "  precision(): '32-true' -> 'bf16-mixed'",
            "return '32-true' from Steps.precision() and 1 from Steps.accumulate_grad_batches()",
        ),
        (
            {"prec": "16-mixed", "accumulate": 3},
            {"prec": "bf16-mixed", "accumulate": 2},
            "  precision(): '16-mixed' -> 'bf16-mixed'\n  accumulate_grad_batches(): 3 -> 2",
            "return '16-mixed' from Steps.precision() and 3 from Steps.accumulate_grad_batches()",
        ),
    ],
    ids=["precision", "both"],
)
def test_a_resume_refuses_a_changed_precision_or_accumulation(
    tmp_path, recorded, resumed, lines, wanted
):
    Nitro(Steps(max_epochs=1, **recorded), run_dir=tmp_path, device="cpu").train()
    latest = sorted(tmp_path.glob("*.safetensors"))[-1]
    with pytest.raises(ResumeRefused) as exc:
        Nitro(Steps(max_epochs=2, **resumed), run_dir=tmp_path, resume="auto", device="cpu")
    assert str(exc.value) == (
        f"Cannot resume {str(latest)!r}: the training step changed since it was recorded:\n"
        f"{lines}\n"
        f"An exact resume takes the step the record was trained with: {wanted}, or start a new "
        "run that takes only the weights: Nitro(exp, weights=...)."
    )


def test_a_resume_may_change_clipping_and_compile(tmp_path):
    Nitro(Steps(max_epochs=1, clip=1.0), run_dir=tmp_path, device="cpu").train()
    c = Nitro(Steps(max_epochs=2, clip=0.5), run_dir=tmp_path, resume="auto", device="cpu")
    assert c.epoch == 1


def test_a_record_from_before_the_step_hooks_resumes_at_their_defaults(tmp_path):
    Nitro(Steps(max_epochs=1), run_dir=tmp_path, device="cpu").train()
    latest = sorted(tmp_path.glob("*.safetensors"))[-1]
    header = recordio.read_header(latest)
    del header["training_step"]
    point = ResumePoint(path=latest, entry=None, meta=header, continue_run=None)
    cpu = torch.device("cpu")
    point.check_step(Steps(), step_settings(Steps(), cpu))
    with pytest.raises(ResumeRefused, match=r"precision\(\): '32-true' -> 'bf16-mixed'"):
        point.check_step(Steps(), step_settings(Steps(prec="bf16-mixed"), cpu))


# -- hook values are checked ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("hooks", "message"),
    [
        ({"prec": "bf16"}, "Steps.precision() returned 'bf16'; return '32-true' (full precision), "
         "'bf16-mixed' or '16-mixed' (autocast with a GradScaler)."),
        ({"accumulate": 0}, "Steps.accumulate_grad_batches() returned 0; return an integer of at "
         "least 1 (the batches summed into one optimizer step; 1 steps after every batch)."),
        ({"clip": 0.0}, "Steps.gradient_clip_val() returned 0.0; return a positive finite number "
         "(the largest total gradient norm, e.g. 1.0), or None for no clipping."),
        ({"clip": float("inf")}, "Steps.gradient_clip_val() returned inf; return a positive finite "
         "number (the largest total gradient norm, e.g. 1.0), or None for no clipping."),
    ],
)  # fmt: skip
def test_step_hook_values_are_checked_at_setup(hooks, message):
    with pytest.raises(ConfigError) as exc:
        Nitro(Steps(**hooks), device="cpu")
    assert str(exc.value) == message


@pytest.mark.parametrize(
    ("hook", "value", "message"),
    [
        ("accumulate_grad_batches", True, "Bad.accumulate_grad_batches() returned True; return an "
         "integer of at least 1 (the batches summed into one optimizer step; 1 steps after every "
         "batch)."),
        ("accumulate_grad_batches", 2.0, "Bad.accumulate_grad_batches() returned 2.0; return an "
         "integer of at least 1 (the batches summed into one optimizer step; 1 steps after every "
         "batch)."),
        ("gradient_clip_val", "1.0", "Bad.gradient_clip_val() returned '1.0'; return a positive "
         "finite number (the largest total gradient norm, e.g. 1.0), or None for no clipping."),
        ("compile", "yes", "Bad.compile() returned 'yes'; return True (torch.compile the model) "
         "or False."),
        ("precision", None, "Bad.precision() returned None; return '32-true' (full precision), "
         "'bf16-mixed' or '16-mixed' (autocast with a GradScaler)."),
    ],
)  # fmt: skip
def test_step_hooks_of_the_wrong_type_are_refused(hook, value, message):
    Bad = type("Bad", (Tiny,), {hook: lambda self: value, "__module__": __name__})
    with pytest.raises(ConfigError) as exc:
        Nitro(Bad(), device="cpu")
    assert str(exc.value) == message


def test_precisions_are_the_documented_three():
    assert PRECISIONS == ("32-true", "bf16-mixed", "16-mixed")


# -- compile() -----------------------------------------------------------------------------------
@pytest.fixture
def eager_compile(monkeypatch):
    """torch.compile through dynamo with the eager backend: the real wrapper (and its
    ``_orig_mod.`` names) in seconds, without inductor's C++ build."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))


def _wrapper_type() -> type:
    from torch._dynamo.eval_frame import OptimizedModule

    return OptimizedModule


def _record_names(path) -> set[str]:
    tensors, _ = recordio.read_record(path)
    return {k for k in tensors if k.startswith(("params/", "buffers/"))}


@pytest.mark.parametrize(("first", "then"), [(True, False), (False, True)])
def test_a_record_written_under_compile_resumes_without_it_and_the_reverse(
    tmp_path, eager_compile, first, then
):
    a_equals_b_plus_c(tmp_path, Steps(compiled=first), compiled=then)
    for path in (tmp_path / "b").glob("*.safetensors"):
        assert _record_names(path) == {"params/0.weight", "params/0.bias", "params/2.weight",
                                       "params/2.bias"}  # fmt: skip


def test_compile_runs_forward_passes_through_the_wrapper_and_writes_plain_names(
    tmp_path, eager_compile
):
    n = Nitro(Steps(compiled=True, max_epochs=1), run_dir=tmp_path, device="cpu")
    assert isinstance(n._forward_model, _wrapper_type())
    assert not isinstance(n.model, _wrapper_type())
    assert n._forward_model._orig_mod is n.model
    n.train()
    plain = Nitro(Steps(max_epochs=1), run_dir=tmp_path / "w", weights=str(
        sorted(tmp_path.glob("*.safetensors"))[-1]), device="cpu")  # fmt: skip
    for k, v in n.model.state_dict().items():
        assert torch.equal(plain.model.state_dict()[k], v), k


def test_a_model_build_model_compiled_itself_is_recorded_under_its_own_names(
    tmp_path, eager_compile
):
    class SelfCompiled(Steps):
        def build_model(self):
            return torch.compile(super().build_model())

    n = Nitro(SelfCompiled(max_epochs=1), run_dir=tmp_path, device="cpu").train()
    assert not isinstance(n.model, _wrapper_type())
    path = sorted(tmp_path.glob("*.safetensors"))[-1]
    assert not any("_orig_mod" in k for k in _record_names(path))
    plain = Nitro(Steps(max_epochs=1), run_dir=tmp_path / "w", weights=str(path), device="cpu")
    for k, v in n.model.state_dict().items():
        assert torch.equal(plain.model.state_dict()[k], v), k
    assert (
        records.model_layout(plain.model, None)["params"]
        == records.model_layout(n.model, None)["params"]
    )


@pytest.mark.slow
def test_inductor_compiled_records_load_both_ways(tmp_path):
    """torch.compile with its default backend (inductor: a C++ build, about a minute on CPU)."""
    exp = Steps(compiled=True, max_epochs=1)
    try:
        n = Nitro(exp, run_dir=tmp_path / "c", device="cpu").train()
    except Exception as exc:  # inductor needs a working C++ compiler
        if type(exc).__name__ in ("BackendCompilerFailed", "InductorError"):
            pytest.skip(f"torch.compile (inductor) cannot compile on this machine: {exc}")
        raise
    written = sorted((tmp_path / "c").glob("*.safetensors"))[-1]
    assert not any("_orig_mod" in k for k in _record_names(written))
    plain = Nitro(Steps(max_epochs=1), run_dir=tmp_path / "p", weights=str(written), device="cpu")
    for k, v in n.model.state_dict().items():
        assert torch.equal(plain.model.state_dict()[k], v), k
    plain.train()
    back = sorted((tmp_path / "p").glob("*.safetensors"))[-1]
    again = Nitro(exp, run_dir=tmp_path / "q", weights=str(back), device="cpu")
    for k, v in plain.model.state_dict().items():
        assert torch.equal(again.model.state_dict()[k], v), k


# -- on a CUDA device (bench/gpu_check.sh) -----------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_on_cuda_resumes_bit_for_bit(tmp_path, precision):
    a = a_equals_b_plus_c(tmp_path, Steps(prec=precision, accumulate=3, clip=0.05), "cuda")
    if precision == "16-mixed":
        assert a.stepper.scaler.state_dict()["scale"] > 0
        assert a.stepper.scaler._scale.device.type == "cuda"


@pytest.mark.cuda
def test_the_grad_scaler_state_round_trips_on_cuda(tmp_path):
    exp = Steps(prec="16-mixed")
    b = _train_epochs(Nitro(exp, run_dir=tmp_path, device="cuda"), 2)
    written = b.stepper.scaler.state_dict()
    c = Nitro(exp, run_dir=tmp_path, resume="auto", device="cuda")
    assert c.stepper.scaler.state_dict() == written


# -- the CausalLM example: the long-run path -----------------------------------------------------
def test_the_causal_lm_example_learns_with_mid_epoch_points_under_bf16_and_accumulation(tmp_path):
    exp = CausalLM(samples=128, every_steps=2, max_epochs=3)  # 8 batches, 4 steps an epoch
    n = Nitro(exp, run_dir=tmp_path, device="cpu").train()
    assert n.step == 12
    assert [(r["epoch"], r.get("batch")) for r in n.history] == [
        (1, 4), (1, None), (2, 4), (2, None), (3, 4), (3, None)
    ]  # fmt: skip
    assert n.history[-1]["val"]["loss"] < 0.9 * math.log(exp.vocab)  # it learns
    for path in tmp_path.glob("*.safetensors"):
        assert recordio.read_header(path)["training_step"] == {
            "precision": "bf16-mixed",
            "accumulate_grad_batches": 2,
            "gradient_clip_val": 1.0,
            "compile": False,
        }


def test_the_causal_lm_example_resumes_a_mid_epoch_record_bit_for_bit(tmp_path):
    exp = CausalLM(samples=128, every_steps=2, max_epochs=2)  # points at steps 2, 4, 6, 8
    a = Nitro(exp, run_dir=tmp_path / "a", device="cpu").train()
    b = Nitro(exp, run_dir=tmp_path / "b", device="cpu")
    trained: list[int] = []

    def loss(model, batch):
        if model.training:
            trained.append(1)
            if len(trained) == 9:  # epoch 2's first batch: the next point (step 6) stops
                b.request_stop()
        return CausalLM.loss(exp, model, batch)

    object.__setattr__(b.experiment, "loss", loss)
    b.train()
    latest = read_manifest(tmp_path / "b")[-1]
    assert (latest.epoch, latest.batch, latest.step) == (2, 4, 6)
    c = Nitro(exp, run_dir=tmp_path / "b", resume="auto", device="cpu")
    assert (c.epoch, c.step) == (2, 6)  # in epoch 2, after its 4th batch
    c.train()
    assert_same_state(a, c)
