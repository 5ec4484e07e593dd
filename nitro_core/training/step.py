"""The training step real runs use: mixed precision, gradient accumulation, norm clipping and
``torch.compile``, chosen by the experiment's hooks (DESIGN.md section 9).

:func:`step_settings` reads and checks the hooks once, at setup. A run whose hooks are all
at their defaults gets no :class:`Stepper`: the loop runs the plain
``zero_grad(); backward(); step()`` with no autocast context, no scaler and no clipping, so
the defaults cost nothing per step (``bench/loop_overhead.py``). Otherwise the Stepper runs
each batch's forward under autocast and its backward into an accumulation window, and steps
the optimizer when the window is full, in this order (as Lightning and nanoGPT do)::

    loss / k -> GradScaler.scale -> backward    (each batch of the window)
    GradScaler.unscale_ -> clip_grad_norm_      (before the step, when clipping)
    GradScaler.step -> GradScaler.update        (or optimizer.step() without a scaler)

Accumulation windows start at the epoch's first batch. An epoch whose batch count is not a
multiple of k ends with a shorter window that steps too, so no batch is left out and each
epoch is a whole number of optimizer steps; its gradients are rescaled by k / (its batches)
before that step, so every step takes the mean gradient of its own window (Lightning scales
a short window by 1/k too, which shrinks its step). Records are written only between
optimizer steps (a checkpoint point follows a step), so no record holds a half-filled window.

``compile()``: the handle keeps the uncompiled module as ``model`` (records are written and
loaded through it, under the model's own parameter names) and runs forward passes through
the compiled wrapper; a model that ``build_model`` compiled itself is unwrapped the same way.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

import torch

from nitro_core.errors import ConfigError
from nitro_core.experiment import Experiment

Precision = Literal["32-true", "bf16-mixed", "16-mixed"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
_AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


@dataclass(frozen=True)
class StepSettings:
    """The values of the experiment's training-step hooks."""

    precision: Precision = "32-true"
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    compile: bool = False

    @property
    def plain(self) -> bool:
        """Whether the step is the plain ``zero_grad(); backward(); step()``."""
        return (
            self.precision == "32-true"
            and self.accumulate_grad_batches == 1
            and self.gradient_clip_val is None
        )

    def header(self) -> dict[str, Any]:
        """The record header's ``training_step`` section."""
        return {
            "precision": self.precision,
            "accumulate_grad_batches": self.accumulate_grad_batches,
            "gradient_clip_val": self.gradient_clip_val,
            "compile": self.compile,
        }

    def steps_per_epoch(self, batches: int) -> int:
        """Optimizer steps in an epoch of ``batches`` batches (a short last window steps too)."""
        return -(-batches // self.accumulate_grad_batches)


def step_settings(exp: Experiment, device: torch.device) -> StepSettings:
    """The experiment's training-step hooks, checked; a ConfigError names the hook, the value
    it returned and what it may return."""
    name = type(exp).__name__
    precision = exp.precision()
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ConfigError(
            f"{name}.precision() returned {precision!r}; return '32-true' (full precision), "
            "'bf16-mixed' or '16-mixed' (autocast with a GradScaler)."
        )
    if precision == "bf16-mixed" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f"{name}.precision() returned 'bf16-mixed', but {device} does not support bfloat16 "
            "(torch.cuda.is_bf16_supported() is False); return '16-mixed' or '32-true' on "
            "this device."
        )
    k = exp.accumulate_grad_batches()
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(
            f"{name}.accumulate_grad_batches() returned {k!r}; return an integer of at least 1 "
            "(the batches summed into one optimizer step; 1 steps after every batch)."
        )
    clip = exp.gradient_clip_val()
    if clip is not None and (
        isinstance(clip, bool)
        or not isinstance(clip, int | float)
        or not math.isfinite(clip)
        or clip <= 0
    ):
        raise ConfigError(
            f"{name}.gradient_clip_val() returned {clip!r}; return a positive finite number "
            "(the largest total gradient norm, e.g. 1.0), or None for no clipping."
        )
    compile_ = exp.compile()
    if not isinstance(compile_, bool):
        raise ConfigError(
            f"{name}.compile() returned {compile_!r}; return True (torch.compile the model) "
            "or False."
        )
    return StepSettings(precision, k, None if clip is None else float(clip), compile_)


def step_diff(recorded: dict[str, Any] | None, current: StepSettings) -> list[str]:
    """Lines naming the hooks whose change makes a resume inexact (precision, accumulation);
    a record written before these hooks existed holds their defaults."""
    recorded = recorded or {}
    lines = []
    for hook in ("precision", "accumulate_grad_batches"):
        was = recorded.get(hook, getattr(StepSettings(), hook))
        now = getattr(current, hook)
        if was != now:
            lines.append(f"  {hook}(): {was!r} -> {now!r}")
    return lines


def autocast(settings: StepSettings, device: torch.device) -> AbstractContextManager[Any]:
    """The context evaluation runs in: autocast under mixed precision, else nothing."""
    dtype = _AUTOCAST_DTYPES.get(settings.precision)
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()


def split_compiled(
    model: torch.nn.Module, compile: bool
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the module records are written and loaded through, the module forward passes run
    through). A ``torch.compile`` wrapper, built here or by ``build_model``, is only ever the
    second, so records never carry its ``_orig_mod.`` prefix."""
    inner = _compiled_inner(model)
    if inner is not None:
        return inner, model
    return model, (cast(torch.nn.Module, torch.compile(model)) if compile else model)


def _compiled_inner(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module inside a ``torch.compile`` wrapper, or None. (Dynamo is imported only when
    something compiled; until then no module can be a wrapper.)"""
    frame = sys.modules.get("torch._dynamo.eval_frame")
    if frame is not None and isinstance(model, frame.OptimizedModule):
        inner = model._orig_mod
        assert isinstance(inner, torch.nn.Module)  # torch.compile wraps a Module
        return inner
    return None


class Stepper:
    """The step of a run whose step is not the plain one: autocast forward passes, an
    accumulation window, a GradScaler under ``"16-mixed"``, norm clipping."""

    def __init__(
        self, settings: StepSettings, optimizer: torch.optim.Optimizer, device: torch.device
    ) -> None:
        self.optimizer = optimizer
        self.accumulate = settings.accumulate_grad_batches
        self.clip = settings.gradient_clip_val
        dtype = _AUTOCAST_DTYPES.get(settings.precision)
        self.autocast = torch.autocast(device.type, dtype=dtype) if dtype is not None else None
        self.scaler = (
            torch.amp.GradScaler(device.type) if settings.precision == "16-mixed" else None
        )
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.pending = 0  # batches backpropagated into the window since the last step

    def forward(self, loss: Callable[[Any, Any], torch.Tensor], model: Any, batch: Any) -> Any:
        """``loss(model, batch)``, under autocast when the precision is mixed."""
        if self.autocast is None:
            return loss(model, batch)
        with self.autocast:
            return loss(model, batch)

    def backward(self, loss: torch.Tensor) -> bool:
        """Add ``loss``'s gradients to the window and step when it is full; returns whether
        the optimizer stepped. (The loop steps a short last window at the epoch's end.)"""
        if self.pending == 0:
            self.optimizer.zero_grad(set_to_none=True)
        if self.accumulate > 1:
            loss = loss / self.accumulate
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        self.pending += 1
        if self.pending < self.accumulate:
            return False
        self.step()
        return True

    def step(self) -> None:
        """Step the optimizer on the window's gradients (a short window's rescaled to its mean)."""
        if self.pending < self.accumulate:
            grads = [p.grad for p in self.params if p.grad is not None]
            if grads:
                torch._foreach_mul_(grads, self.accumulate / self.pending)
        if self.scaler is not None:
            if self.clip is not None:
                self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.params, self.clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            if self.clip is not None:
                torch.nn.utils.clip_grad_norm_(self.params, self.clip)
            self.optimizer.step()
        self.pending = 0
