"""The loading keywords of ``Nitro`` (resume, weights, restore_optimizer, restore_best,
load_ema, strict), normalized and checked against each other before anything is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from nitro_core.errors import ConfigError, Redo, Worded, arg
from nitro_core.sources.grammar import Average, Source, parse_average, to_source

_RESTORE_OPTIMIZER, _LOAD_EMA, _LOOSE = (
    arg("restore_optimizer", True), arg("load_ema", True), arg("strict", False)
)  # fmt: skip


@dataclass(frozen=True)
class LoadOptions:
    resume: Source | Literal["auto"] | None
    weights: Source | None
    restore_optimizer: bool
    restore_best: bool | Average
    load_ema: bool
    strict: bool


def check_options(
    resume: Any,
    weights: Any,
    restore_optimizer: bool,
    restore_best: Any,
    load_ema: bool,
    strict: bool,
) -> LoadOptions:
    """Refuse combinations that cannot mean anything, with what to write instead."""
    for keyword, value in (
        ("restore_optimizer", restore_optimizer),
        ("load_ema", load_ema),
        ("strict", strict),
    ):
        if not isinstance(value, bool):
            raise ConfigError(f"{keyword}={value!r} must be True or False.")
    if resume is True or resume in ("true", ":true"):
        raise ConfigError(
            arg("resume", True),
            " is ambiguous; write resume='auto' (the latest record, or a fresh run when there "
            "is none) or a source such as resume='latest => latest'.",
        )
    res: Source | Literal["auto"] | None
    if resume in (False, None, "false", ":false"):
        res = None
    elif resume in ("auto", ":auto"):
        res = "auto"
    else:
        res = to_source(resume, "resume")
    src = None if weights is None else to_source(weights, "weights")
    averaged = src is not None and src.averaged() is not None
    if res is not None and src is not None:
        raise ConfigError(
            "Give resume= to continue a run exactly, or weights= to start a new run from a "
            "checkpoint's parameters, not both."
        )
    if restore_optimizer:
        if res is not None:
            raise ConfigError(
                _RESTORE_OPTIMIZER,
                " is for weights=; a resume already restores the optimizer (and the step, "
                "schedule and RNG). Drop restore_optimizer.",
            )
        if src is None:
            raise ConfigError(
                _RESTORE_OPTIMIZER,
                " needs weights=...: it takes the optimizer state of the checkpoint weights= "
                "names. Write ",
                Redo((arg("weights", "latest => best"), _RESTORE_OPTIMIZER)),
                ", or resume='latest => latest' to continue exactly.",
            )
        if averaged:
            raise ConfigError(
                _RESTORE_OPTIMIZER,
                f" with weights={str(src)!r}: an average carries no optimizer state. Drop "
                "restore_optimizer, or load one record: weights='latest => best'.",
            )
    if not strict and res is not None:
        raise ConfigError(
            _LOOSE,
            " loads leaves by name, which cannot continue a run exactly. Drop ",
            _LOOSE,
            " to resume, or start a new run with weights=..., ",
            _LOOSE,
            ".",
        )
    if load_ema and src is None:
        raise ConfigError(
            _LOAD_EMA,
            " loads the EMA copy of the checkpoint weights= names; write ",
            Redo((arg("weights", "latest => best"), _LOAD_EMA)),
            ". A resume restores the EMA as the EMA already.",
        )
    return LoadOptions(
        res, src, bool(restore_optimizer), _restore_best(restore_best), bool(load_ema), bool(strict)
    )


def _restore_best(value: Any) -> bool | Average:
    if isinstance(value, bool | Average):
        return value
    if isinstance(value, str):
        text = value.strip().lstrip(":")
        if text in ("true", "false"):
            return text == "true"
        return parse_average(value)
    raise ConfigError(
        f"restore_best={value!r}: ",
        Worded(
            "write True (the run's best checkpoint), False, or an average such as "
            "Average(Last(10)) or 'Average(Last(10))'.",
            "send restore_best=true (the run's best checkpoint), false, or an average such as "
            "'Average(Last(10))'.",
        ),
    )
