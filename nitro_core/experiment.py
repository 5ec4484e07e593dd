"""Experiments: frozen pydantic models whose fields are the config and whose methods are hooks.

A field marked ``Host[T]`` may change between a run and its resume (``max_epochs`` is the
usual one); every other field is part of the resume check. Hooks with a default are
listed in ``OPTIONAL_HOOKS``; ``build_data``, ``build_model`` and ``loss`` are required and
checked at setup by :func:`check_required_hooks`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, TypeVar

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, field_validator

from nitro_core.errors import ConfigError, FieldFix, MissingHookError, Part
from nitro_core.policy.selectors import Best, Checkpointer, Last
from nitro_core.store.metrics_log import JSONLLogger

if TYPE_CHECKING:  # the hooks' types; torch loads when a hook runs (a server lists without it)
    import torch


class _HostMark:
    """Metadata marking a field that may change between a run and its resume."""

    def __repr__(self) -> str:
        return "Host"


_HOST = _HostMark()


_T = TypeVar("_T")

Host: TypeAlias = Annotated[_T, _HOST]
"""``Host[T]`` is ``Annotated[T, <Host mark>]``: a field a resume does not compare. A generic
alias, so ``max_epochs: Host[int] = 5`` type-checks as an ``int`` in mypy and pyright."""


REQUIRED_HOOKS: tuple[str, ...] = ("build_data", "build_model", "loss")
OPTIONAL_HOOKS: tuple[str, ...] = (
    "build_optimizer",
    "metrics",
    "finalize_metrics",
    "eval_loss",
    "monitor",
    "checkpointer",
    "lr_scheduler",
    "ema",
    "early_stopping",
    "plateau",
    "decay_anchor",
    "logger",
    "precision",
    "accumulate_grad_batches",
    "gradient_clip_val",
    "compile",
)

_HOOK_SIGNATURES = {
    "build_data": "def build_data(self): return {'train': ..., 'val': ...}",
    "build_model": "def build_model(self): return torch.nn.Linear(...)",
    "loss": "def loss(self, model, batch): return <scalar tensor>",
}


class Experiment(BaseModel):
    """Base class of every experiment: subclass it, add fields, override hooks."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, validate_default=True)

    max_epochs: Host[int] = 10

    @field_validator("max_epochs", check_fields=False)
    @classmethod
    def _at_least_one_epoch(cls, v: int) -> int:
        if v < 1:
            raise ValueError("max_epochs must be at least 1")
        return v

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(*describe_validation_error(type(self), exc)) from None

    # -- required hooks ---------------------------------------------------------------
    def build_data(self) -> Mapping[str, Iterable[Any]]:
        """Split name -> re-iterable of batches; ``"train"`` is required to train."""
        raise NotImplementedError

    def build_model(self) -> torch.nn.Module:
        """The model; called after every RNG has been seeded."""
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """A scalar tensor to minimize."""
        raise NotImplementedError

    # -- optional hooks ---------------------------------------------------------------
    def build_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """Default: ``AdamW(lr=self.lr)`` when the experiment has an ``lr`` field, else 1e-3."""
        import torch  # lazy: an experiment's config is read without torch

        return torch.optim.AdamW(model.parameters(), lr=float(getattr(self, "lr", 1e-3)))

    def metrics(self, model: torch.nn.Module, batch: Any) -> dict[str, tuple[Any, Any]]:
        """Name -> (sum, count) for one batch. Not defining it ranks by validation loss."""
        raise NotImplementedError

    def finalize_metrics(
        self, totals: dict[str, tuple[float, float]], split: str
    ) -> dict[str, float]:
        """Totals over a split -> reported metrics. Default: sum / count for each name."""
        return {name: s / c if c else float("nan") for name, (s, c) in totals.items()}

    def eval_loss(self) -> bool:
        """Report the validation loss as ``loss`` beside custom metrics."""
        return False

    def monitor(self) -> tuple[str, Literal["min", "max"]]:
        """The (metric, mode) that ranks checkpoints and drives early stopping and plateaus."""
        return ("loss", "min")

    def checkpointer(self) -> Any:
        """Which records to keep; ``None`` writes nothing."""
        return Checkpointer(keep=(Best(3), Last(1)))

    def lr_scheduler(self, optimizer: torch.optim.Optimizer, total_steps: int | None) -> Any:
        """A scheduler stepped once per optimizer step, or None. ``total_steps`` is
        ``max_epochs`` times the optimizer steps per epoch (the batches per epoch divided by
        ``accumulate_grad_batches()``, rounded up), or None when the training data has no
        length."""
        return None

    def ema(self) -> Any:
        """``EMA(decay=...)`` to keep an exponential moving average of the weights, or None."""
        return None

    def stateful(self, data: dict[str, Any]) -> dict[str, Any]:
        """Your own objects whose state is part of an exact resume (a curriculum, a replay
        buffer, a data mixture's weights), by name: each has ``state_dict()`` and
        ``load_state_dict(state)`` (torch's ``Stateful``), its state made of tensors,
        numbers, strings, lists and dicts (a record never holds a pickle). Called once with
        the data splits ``build_data`` returned; every record holds their states (section
        ``stateful/``) and a resume loads them back before training continues."""
        return {}

    def early_stopping(self) -> Any:
        """``EarlyStopping(patience=, min_delta=)`` watching the monitor, or None."""
        return None

    def plateau(self) -> Any:
        """``Plateau(factor=, patience=)``: reduce the learning rate when the monitor stalls."""
        return None

    def decay_anchor(self) -> Literal["zero", "w0"]:
        """Where decoupled weight decay pulls: toward zero or toward the initial weights."""
        return "zero"

    def logger(self) -> Any:
        """The metrics logger; default a JSONL file per run in the run directory. Return
        ``TensorBoardLogger()`` for TensorBoard event files too; ``Nitro(..., logger=...)``
        overrides this hook."""
        return JSONLLogger()

    # -- the training step (nitro_core.training.step; a resume refuses a changed precision
    # or accumulation, since either changes the trajectory) ------------------------------
    def precision(self) -> Literal["32-true", "bf16-mixed", "16-mixed"]:
        """``"32-true"``: full precision. ``"bf16-mixed"``: the forward pass (``loss``, and
        evaluation) under ``torch.autocast`` in bfloat16, weights and optimizer in float32.
        ``"16-mixed"``: autocast in float16 with a ``GradScaler``, whose state is in the record."""
        return "32-true"

    def accumulate_grad_batches(self) -> int:
        """Batches whose gradients are summed into one optimizer step (each loss scaled by 1/k).
        The step count, ``every_steps`` and ``lr_scheduler``'s ``total_steps`` count optimizer
        steps. An epoch whose batches are not a multiple of k ends with a shorter window that
        steps too, on the mean of its own batches' gradients."""
        return 1

    def gradient_clip_val(self) -> float | None:
        """Clip the gradients' total 2-norm to this value before each optimizer step (after
        unscaling under ``"16-mixed"``), or None for no clipping."""
        return None

    def compile(self) -> bool:
        """``torch.compile`` the model for its forward passes. Records keep the model's own
        parameter names (no ``_orig_mod.``), so a record written with compile loads into an
        uncompiled model and the other way round."""
        return False


def defines(exp: Experiment, hook: str) -> bool:
    """Whether the experiment's class overrides ``hook`` of :class:`Experiment`."""
    return getattr(type(exp), hook) is not getattr(Experiment, hook)


def check_required_hooks(exp: Experiment) -> None:
    """Refuse an experiment that leaves a required hook undefined."""
    for hook in REQUIRED_HOOKS:
        if not defines(exp, hook):
            name = type(exp).__name__
            raise MissingHookError(
                f"{name} does not define the required hook {hook}. "
                f"Add to class {name}: {_HOOK_SIGNATURES[hook]}"
            )


def host_fields(cls: type[Experiment]) -> frozenset[str]:
    """Names of the fields marked ``Host[T]``."""
    return frozenset(
        name for name, info in cls.model_fields.items() if any(m is _HOST for m in info.metadata)
    )


def config_of(exp: Experiment) -> dict[str, Any]:
    """The experiment's config as JSON-ready data."""
    return exp.model_dump(mode="json")


def changed_fields(parent: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Every config field (Host ones too) a branch changed from its parent: field -> [old,
    new], null on the side that lacks the field. The lineage shown by nitro_compare."""
    return {
        name: [parent.get(name), child.get(name)]
        for name in [*parent, *(n for n in child if n not in parent)]
        if name not in parent or name not in child or not same_value(parent[name], child[name])
    }


def same_value(a: Any, b: Any) -> bool:
    """Whether two config values are equal as the config's JSON says: ``==``, but NaN equal
    to NaN (``float('nan') != float('nan')``, while both are the JSON ``NaN`` a record keeps),
    in lists and dicts too."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return bool(a == b)


def config_diff(recorded: Mapping[str, Any], exp: Experiment) -> list[str]:
    """Lines describing how ``exp``'s plain (non-Host) fields differ from ``recorded``.

    A field added since the record is compatible while it holds its declared default.
    """
    cls = type(exp)
    host = host_fields(cls)
    current = config_of(exp)
    lines = []
    for name, info in cls.model_fields.items():
        if name in host:
            continue
        if name not in recorded:
            assert info.annotation is not None  # pydantic stores `x: None` as NoneType
            default = TypeAdapter(info.annotation).dump_python(
                info.get_default(call_default_factory=True), mode="json"
            )
            if current[name] != default:
                lines.append(
                    f"  {name}: (not in the record; compatible only at its default "
                    f"{default!r}) -> {current[name]!r}"
                )
        elif not same_value(recorded[name], current[name]):
            lines.append(f"  {name}: {recorded[name]!r} -> {current[name]!r}")
    for name in sorted(set(recorded) - set(cls.model_fields)):
        lines.append(f"  {name}: {recorded[name]!r} -> (field removed)")
    return lines


def describe_validation_error(cls: type[BaseModel], exc: ValidationError) -> tuple[Part, ...]:
    """One message naming each bad field, its value, and what the field accepts, ending in
    the fix: the first field given a value it does not take, else the first unknown name."""
    name = cls.__name__
    fields = ", ".join(cls.model_fields)
    parts = []
    typed: tuple[str, str] | None = None
    unknown: str | None = None
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(config)"
        value = err.get("input")
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown field {field!r}; {name} has the fields: {fields}")
            unknown = unknown or field
            continue
        info = cls.model_fields.get(str(err["loc"][0])) if err["loc"] else None
        expected = _type_name(info.annotation) if info is not None else "?"
        parts.append(
            f"field {field!r} expects {expected}, got {value!r} ({type(value).__name__}): "
            f"{err['msg']}"
        )
        typed = typed or (field, expected)
    bad, bad_type = typed or (None, None)
    fix = FieldFix(name, tuple(cls.model_fields), bad, bad_type, None if typed else unknown)
    return f"{name}: " + "; ".join(parts) + ". ", fix


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or repr(annotation)
