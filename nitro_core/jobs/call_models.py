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

import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationInfo, field_validator

MAX_NPROC = 64  # processes of one training, through torch.distributed.run
MAX_NODES = 1024  # nodes of one training on a cluster (the cluster's own count bounds it too)
# the sbatch options a call may add as extra lines: none that moves the job's files or output
SBATCH_ALLOWED = (
    "--mem", "--mem-per-cpu", "--mem-per-gpu", "--cpus-per-task", "--gpus-per-node",
    "--gpus-per-task", "--constraint", "--exclusive", "--reservation", "--comment",
    "--exclude", "--nodelist", "--mail-type", "--mail-user", "--nice", "--licenses",
)  # fmt: skip


@dataclass(frozen=True)
class Refusal:
    """What a value of the right type outside the bounds or the closed set of the field it
    annotates is told: ``text`` with ``{value}`` (the value as sent). Other refusals (a
    wrong type, a missing value) are in the general words of ``nitro_mcp.arguments``;
    pydantic itself ignores this mark."""

    text: str

    def say(self, value: str) -> str:
        return self.text.format(value=value)


LOGGER_REFUSAL = (
    "logger={value} is not a logger; send logger='jsonl', 'tensorboard' (event files in "
    "<run_dir>/logs/tb/<run>/, beside the JSONL log), 'mlflow' or 'wandb' (an MLflow or W&B "
    "run, set by MLFLOW_TRACKING_URI or WANDB_MODE, WANDB_PROJECT where the server runs), or "
    "leave it out for the experiment's own logger()."
)
_OVERRIDES = 'Config fields, e.g. {"lr": 0.1}; a resume changes Host fields only.'
_RECORD_OVERRIDES = 'Config fields over the record\'s, e.g. {"lr": 0.1}.'
_EXPERIMENT = "A name nitro_experiments lists."
_RUN_DIR = "Run directory inside the root; default runs/<experiment>."


# What each Slurm option may hold (DESIGN section 16): the value reaches sbatch as one argv
# element, never as script text, and still holds no whitespace, control character, quote or
# shell metacharacter, and starts with no ``-`` (it could read as another option).
SLURM_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.,-]{0,127}$"  # partition, account, qos (a,b: a list)
SLURM_GRES = r"^[A-Za-z0-9_][A-Za-z0-9_.,:-]{0,127}$"  # e.g. gpu:4, gpu:a100:2,mps:100
_VALUE = r"[A-Za-z0-9_.:,@%+/=\[\]][A-Za-z0-9_.:,@%+/=\[\]-]{0,255}"
SLURM_EXTRA = rf"^--[a-z][a-z-]*(?:={_VALUE})?$"  # one option; its name from SBATCH_ALLOWED
_SLURM_SAMPLES = {"partition": "debug", "account": "research", "qos": "normal", "gres": "gpu:4"}


def _clipped(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "…"


class SlurmOptions(BaseModel):
    """Where a Slurm job runs: its partition, account, generic resources, quality of
    service, and extra sbatch options from :data:`SBATCH_ALLOWED`, one ``--name=value`` per
    item. Every value is checked against a pattern the schema publishes, and reaches sbatch
    as one argv element (:func:`nitro_core.jobs.slurm.sbatch_argv`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    partition: str | None = Field(
        default=None, pattern=SLURM_NAME, description="Default the cluster's."
    )
    account: str | None = Field(default=None, pattern=SLURM_NAME, description="Account to charge.")
    gres: str | None = Field(
        default=None, pattern=SLURM_GRES, description="Generic resources, e.g. 'gpu:4'."
    )
    qos: str | None = Field(default=None, pattern=SLURM_NAME, description="Quality of service.")
    extra: list[Annotated[str, Field(pattern=SLURM_EXTRA)]] = Field(
        default_factory=list,
        max_length=32,
        description="Allowed sbatch options, e.g. ['--mem=16G'].",
    )

    @field_validator("partition", "account", "qos", "gres", mode="before")
    @classmethod
    def _one_word(cls, value: Any, info: ValidationInfo) -> Any:
        pattern = SLURM_GRES if info.field_name == "gres" else SLURM_NAME
        if isinstance(value, str) and not re.fullmatch(pattern, value):
            name = info.field_name
            raise ValueError(
                f"slurm.{name}={_clipped(value)} is not a Slurm {name}: it must match {pattern} "
                "(no space, control character, quote or shell character, no leading '-'). "
                f"Send e.g. slurm={{'{name}': '{_SLURM_SAMPLES[str(name)]}'}}."
            )
        return value

    @field_validator("extra", mode="before")
    @classmethod
    def _single_options(cls, value: Any) -> Any:
        for item in value if isinstance(value, list) else []:
            if not isinstance(item, str):
                continue
            flag = re.match(r"\s*(-*[A-Za-z-]*)", item).group(1)  # type: ignore[union-attr]
            if flag in SBATCH_ALLOWED and re.fullmatch(SLURM_EXTRA, item):
                continue
            if flag not in SBATCH_ALLOWED:
                raise ValueError(
                    f"slurm.extra line {_clipped(item)} is not an sbatch option Nitro passes "
                    "on: the job's directory, output and working directory are Nitro's. Send "
                    f"only {', '.join(SBATCH_ALLOWED)}, e.g. slurm={{'extra': ['--mem=16G']}}."
                )
            raise ValueError(
                f"slurm.extra item {_clipped(item)} is not one sbatch option: each item is one "
                f"--name=value matching {SLURM_EXTRA} (no space, control character, quote or "
                "shell character; a value starts with no '-'). Send one option an item, e.g. "
                "slurm={'extra': ['--mem=16G', '--comment=nightly']}."
            )
        return value


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
    passed_apart: ClassVar[frozenset[str]] = frozenset(
        {"experiment", "overrides", "nproc", "executor", "nodes", "slurm"}
    )

    experiment: str = Field(description=_EXPERIMENT)
    run_dir: str | None = Field(default=None, description=_RUN_DIR)
    resume: StrictBool | str = Field(
        default="false",
        description="false (new run), 'auto' (the latest record, else fresh) or a source.",
    )
    weights: str | None = Field(
        default=None,
        description="Start parameters (fresh optimizer), e.g. 'latest => best'.",
    )
    restore_best: StrictBool | str = Field(
        default="false",
        description="End holding: true (the best) or e.g. 'Average(Last(10))'.",
    )
    restore_optimizer: StrictBool = Field(
        default=False, description="With weights: its optimizer state too."
    )
    strict: StrictBool = Field(
        default=True, description="false: load weights by name, warn on the rest."
    )
    seed: int | None = Field(default=None, description="Default 0 (a resume keeps its own).")
    overrides: dict[str, Any] = Field(default_factory=dict, description=_OVERRIDES)
    device: str = Field(default="auto", description="e.g. 'cpu', 'cuda:0'.")
    logger: Annotated[
        Literal["jsonl", "tensorboard", "mlflow", "wandb"] | None,
        Refusal(LOGGER_REFUSAL),
    ] = Field(
        default=None,
        description="Default the experiment's (a resume keeps the run's).",
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
        description="Processes (torchrun), e.g. one per GPU.",
    )
    strategy: Annotated[
        Literal["auto", "ddp", "fsdp"],
        Refusal(
            "strategy={value} is not a strategy; send 'auto' (DDP when nproc > 1), 'ddp' or 'fsdp'."
        ),
    ] = Field(default="auto", description="auto: DDP when nproc > 1.")
    max_steps: Annotated[
        int | None,
        Refusal(
            "max_steps={value} is not a step budget; send a positive integer, e.g. "
            "max_steps=1000 (optimizer steps of the run, counted from its start), or leave it out."
        ),
    ] = Field(
        default=None,
        ge=1,
        description="A budget of steps (stop_reason 'budget').",
    )
    time_limit: Annotated[
        float | None,
        Refusal(
            "time_limit={value} is not a time budget; send a positive number of seconds, e.g. "
            "time_limit=3600, or leave it out."
        ),
    ] = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="A budget of seconds (stop_reason 'budget').",
    )
    executor: Annotated[
        Literal["local", "slurm"] | None,
        Refusal(
            "executor={value} is not an executor; send 'local' (worker processes on the "
            "server's machine) or 'slurm' (sbatch on the cluster), or leave it out for the "
            "server's default."
        ),
    ] = Field(
        default=None,
        description="Default the server's (nitro serve --executor).",
    )
    nodes: Annotated[
        int,
        Refusal(
            f"nodes={{value}} is not a node count; send an integer from 1 to {MAX_NODES}, e.g. "
            "nodes=2 (with executor='slurm')."
        ),
    ] = Field(
        default=1, ge=1, le=MAX_NODES,
        description="Slurm nodes, each running nproc processes.",
    )  # fmt: skip
    slurm: SlurmOptions | None = Field(
        default=None,
        description="Slurm options (executor='slurm').",
    )

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
        description="e.g. 'latest => best', 'latest => Average(Last(10))' or a path.",
    )
    split: str = Field(default="val", description="e.g. 'val', 'test'.")
    load_ema: StrictBool = Field(default=False, description="Evaluate its EMA weights.")
    overrides: dict[str, Any] = Field(default_factory=dict, description=_RECORD_OVERRIDES)

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

    run_dir: str = Field(description="A run directory.")
    source: str = Field(
        default="latest => Average(Last(10))",
        description="e.g. 'latest => Average(Best(5; among=Last(20)))'.",
    )
    save: str | None = Field(
        default=None,
        description="A new record path for the average.",
    )
    experiment: str | None = Field(
        default=None,
        description="With validate; default the record's.",
    )
    validate_average: StrictBool = Field(
        default=False, alias="validate", description="Also evaluate it on split."
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="With validate: config fields over the record's.",
    )
    split: str = Field(default="val", description="With validate: the split.")

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
    "CALLS", "MAX_NODES", "MAX_NPROC", "SBATCH_ALLOWED", "AverageCall", "Call", "Refusal",
    "SlurmOptions", "TrainCall", "ValidateCall", "defaults",
]  # fmt: skip
