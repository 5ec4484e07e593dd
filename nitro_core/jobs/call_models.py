"""The call models: the parameters of a training, a validation and an average, spelled once.

``TrainCall``, ``ValidateCall`` and ``AverageCall`` are what the MCP tools ``nitro_train``,
``nitro_validate`` and ``average`` take (their input schemas are generated from these
fields, flat), what a job's ``spec.json`` stores, what ``nitro train``, ``validate`` and
``average`` build, and what the worker hands to ``Nitro(...)`` or ``average_checkpoints``
(:meth:`TrainCall.nitro_kwargs`, :meth:`ValidateCall.nitro_kwargs`,
:meth:`AverageCall.average_kwargs`). A new option is one field here: closed sets are
``Literal``, bounds are ``Field(ge=, le=)``, and each field says what it does in its
``description``, which the published schema shows an agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

MAX_NPROC = 64  # processes of one training, through torch.distributed.run


@dataclass(frozen=True)
class Refusal:
    """What a value of the right type outside the bounds or the closed set of the field it
    annotates is told: ``text`` with ``{value}`` (the value as sent). Other refusals (a
    wrong type, a missing value) are in the general words of ``nitro_mcp.arguments``;
    pydantic itself ignores this mark."""

    text: str

    def say(self, value: str) -> str:
        return self.text.format(value=value)


_OVERRIDES = (
    'Config fields to set, e.g. {"max_epochs": 3}; on top of the record\'s config when '
    "validating or resuming (a resume changes Host fields only). nitro_experiments lists the "
    "fields."
)
_EXPERIMENT = "A registered experiment name (nitro_experiments lists them)."
_RUN_DIR = "Run directory inside the root; default runs/<experiment>."


class _Call(BaseModel):
    """A call: no unknown field, never changed once built."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True)
    kind: ClassVar[Literal["train", "validate", "average"]]
    passed_apart: ClassVar[frozenset[str]] = frozenset()  # fields not passed on as keywords

    @field_validator("overrides", mode="before", check_fields=False)
    @classmethod
    def _no_overrides(cls, value: Any) -> Any:
        return {} if value is None else value  # null: none

    def _keywords(self) -> dict[str, Any]:
        """Every field not named in ``passed_apart``, by name, as given."""
        return {k: getattr(self, k) for k in type(self).model_fields if k not in self.passed_apart}


class TrainCall(_Call):
    """Train an experiment: ``Nitro(experiment(**overrides), **nitro_kwargs()).train()``,
    on ``nproc`` processes."""

    kind: ClassVar[Literal["train"]] = "train"
    passed_apart: ClassVar[frozenset[str]] = frozenset({"experiment", "overrides", "nproc"})

    experiment: str = Field(description=_EXPERIMENT)
    run_dir: str | None = Field(default=None, description=_RUN_DIR)
    resume: StrictBool | str = Field(
        default="false",
        description="false (a new run), 'auto' (continue the latest record, or start fresh), "
        "or a source to resume exactly.",
    )
    weights: str | None = Field(
        default=None,
        description="A source whose parameters start a new run (fresh optimizer), e.g. "
        "'latest => best'.",
    )
    restore_best: StrictBool | str = Field(
        default="false",
        description="false, true (end holding the run's best checkpoint) or 'Average(Last(10))'.",
    )
    restore_optimizer: StrictBool = Field(
        default=False, description="With weights: also take its optimizer state."
    )
    strict: StrictBool = Field(
        default=True, description="False: load weights by name, warning about the rest."
    )
    seed: int | None = Field(
        default=None, description="Seed for every RNG; default 0 (a resume keeps its own)."
    )
    overrides: dict[str, Any] = Field(default_factory=dict, description=_OVERRIDES)
    device: str = Field(default="auto", description="'auto', 'cpu' or 'cuda:0'.")
    logger: Annotated[
        Literal["jsonl", "tensorboard"] | None,
        Refusal(
            "logger={value} is not a logger; send logger='jsonl' or logger='tensorboard' (event "
            "files in <run_dir>/logs/tb/<run>/, beside the JSONL log), or leave it out for the "
            "experiment's own logger()."
        ),
    ] = Field(
        default=None,
        description="'jsonl' or 'tensorboard' (also writes logs/tb/<run>/); default the "
        "experiment's logger(). A resume keeps the run's.",
    )
    nproc: Annotated[
        int,
        Refusal(
            f"nproc={{value}} is not a process count; send an integer from 1 to {MAX_NPROC}, "
            "e.g. nproc=2 (one process per GPU, or several on CPU with the gloo backend)."
        ),
    ] = Field(
        default=1,
        ge=1,
        le=MAX_NPROC,
        description="Processes (torch.distributed.run), e.g. one per GPU.",
    )
    strategy: Annotated[
        Literal["auto", "ddp", "fsdp"],
        Refusal(
            "strategy={value} is not a strategy; send 'auto' (DDP when nproc > 1), 'ddp' or 'fsdp'."
        ),
    ] = Field(default="auto", description="'auto' (DDP when nproc > 1), 'ddp' or 'fsdp'.")

    def nitro_kwargs(self) -> dict[str, Any]:
        """The keywords of ``Nitro(experiment, ...)``: every field but the experiment, its
        overrides and the process count."""
        return self._keywords()


class ValidateCall(_Call):
    """Evaluate a checkpoint: ``Nitro(experiment, **nitro_kwargs()).evaluate(split)``, the
    experiment built from the record's config with ``overrides`` on top."""

    kind: ClassVar[Literal["validate"]] = "validate"
    passed_apart: ClassVar[frozenset[str]] = frozenset({"experiment", "overrides", "split"})

    experiment: str = Field(description=_EXPERIMENT)
    run_dir: str | None = Field(default=None, description=_RUN_DIR)
    weights: str = Field(
        default="latest => best",
        description="A checkpoint source, e.g. 'latest => best', '<run id> => latest', "
        "'latest => Average(Last(10))', or a .safetensors path inside the root.",
    )
    split: str = Field(
        default="val", description="The data split to evaluate, e.g. 'val' or 'test'."
    )
    load_ema: StrictBool = Field(
        default=False, description="Evaluate the checkpoint's EMA weights."
    )
    overrides: dict[str, Any] = Field(default_factory=dict, description=_OVERRIDES)

    def nitro_kwargs(self) -> dict[str, Any]:
        """The keywords of ``Nitro(experiment, ...)``: every field but the experiment, its
        overrides and the split."""
        return self._keywords()


class AverageCall(_Call):
    """Average checkpoints of one run: ``average_checkpoints(**average_kwargs())``, saved to
    ``save`` and validated on ``split`` when asked."""

    kind: ClassVar[Literal["average"]] = "average"
    passed_apart: ClassVar[frozenset[str]] = frozenset(
        {"save", "experiment", "validate_average", "overrides", "split"}
    )

    run_dir: str = Field(description="The run directory inside the root.")
    source: str = Field(
        default="latest => Average(Last(10))",
        description="What to average: 'latest => Average(Last(10))', "
        "'<run id> => Average(Best(5; among=Last(20)))', 'latest => Average(Epochs(8:10))'.",
    )
    save: str | None = Field(
        default=None,
        description="Write the average as a record here (inside the root; never overwritten).",
    )
    experiment: str | None = Field(
        default=None,
        description="With validate=true; default: the one the record was written by.",
    )
    validate_average: StrictBool = Field(
        default=False, alias="validate", description="Also evaluate the average on split."
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="With validate=true: config fields to change from the record's, "
        'e.g. {"batch_size": 256}.',
    )
    split: str = Field(default="val", description="With validate=true: the data split to evaluate.")

    def average_kwargs(self) -> dict[str, Any]:
        """The arguments of ``average_checkpoints(run_dir, source)``."""
        return self._keywords()


Call = TrainCall | ValidateCall | AverageCall
CALLS: dict[str, type[TrainCall] | type[ValidateCall] | type[AverageCall]] = {
    "train": TrainCall,
    "validate": ValidateCall,
    "average": AverageCall,
}


def defaults(model: type[BaseModel]) -> dict[str, Any]:
    """Each field's default, by the name a call writes (its alias when it has one)."""
    return {
        info.alias or name: info.get_default(call_default_factory=True)
        for name, info in model.model_fields.items()
        if not info.is_required()
    }


__all__ = [
    "CALLS", "MAX_NPROC", "AverageCall", "Call", "Refusal", "TrainCall", "ValidateCall", "defaults",
]  # fmt: skip
