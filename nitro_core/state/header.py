"""The schema of a record's JSON header (the ``nitro`` metadata key), for documentation,
``schemas/record-header.json`` and the test that keeps the writer honest. The writer
builds the header as plain data; this model is what it must validate against."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Layout(BaseModel):
    model_config = ConfigDict(extra="forbid")

    params: list[tuple[str, list[int], str]] = Field(
        description="(state-dict key, shape, dtype) per parameter."
    )
    buffers: list[tuple[str, list[int], str]] = Field(
        description="Layer state (buffers), likewise."
    )
    aliases: dict[str, str] = Field(description="Tied keys -> the key stored once.")
    groups: list[list[str]] = Field(description="Parameter names per optimizer group.")


class RecordHeader(BaseModel):
    """Everything in a record that is not a tensor."""

    model_config = ConfigDict(extra="forbid")

    format_version: int
    framework_version: str
    step: int
    epoch: int = Field(description="The epoch the record ends, or is in (mid-epoch).")
    batch: int | None = Field(
        default=None, description="Batches of the epoch consumed (mid-epoch); null at its end."
    )
    position: dict[str, Any] | None = Field(
        default=None,
        description="Where a mid-epoch record's epoch stands: batch, loss_sum and loss_dtype "
        "(the epoch's summed training loss so far), epoch_rng (Python and NumPy generators "
        "at the epoch's start; torch's are tensors under rng/epoch/). Null at an epoch end.",
    )
    data: Any = Field(
        default=None,
        description="The train split's state_dict() at a mid-epoch record, when it has one "
        "(tree-encoded; tensors under rng/data/).",
    )
    seed: int
    run: str
    parent: str | None
    parent_diff: dict[str, list[Any]] | None = Field(
        default=None,
        description="The config fields this run changed from the record it branched from "
        "(parent): field -> [old, new]; null for a run that did not branch.",
    )
    experiment: str = Field(description="The experiment class name.")
    config: dict[str, Any]
    host_fields: list[str]
    metrics: dict[str, float] = Field(description="Finalized 'val' metrics of this epoch.")
    budget: dict[str, Any] | None = Field(
        default=None,
        description="The budget of the train() call that wrote the record: max_steps and "
        "time_limit (seconds); null when it had none.",
    )
    metric: str | None
    mode: Literal["min", "max"] | None
    stop_reason: Literal["completed", "early_stop", "requested", "budget"] | None
    history: list[dict[str, Any]] | None = None
    rng: dict[str, Any] | None = Field(
        description="Python and NumPy generator state (torch's are tensors under rng/)."
    )
    logger: dict[str, Any]
    early_stopping: dict[str, Any] | None
    ema_meta: dict[str, Any] | None
    decay_anchor: Literal["zero", "w0"]
    w0_checksum: str | None
    loaded_from: str | None
    averaged_from: dict[str, Any] | None
    environment: dict[str, Any]
    layout: Layout
    optimizer: dict[str, Any] | None = Field(
        description="Non-tensor optimizer state (None in an average)."
    )
    optimizer_class: str
    scheduler: Any = None
    plateau: Any = None
    stateful: dict[str, Any] | None = Field(
        default=None,
        description="The experiment's own components (Experiment.stateful), by name, each "
        "state tree-encoded (tensors under stateful/<name>/); absent when it has none.",
    )
    scaler: Any = Field(
        default=None, description="The GradScaler's state (16-mixed precision), tree-encoded."
    )
    distributed: dict[str, Any] | None = Field(
        default=None,
        description="The processes that wrote it: {'world': N, 'strategy': 'none' | 'ddp' | "
        "'fsdp'} (absent in records written before it existed).",
    )
    ranks: dict[str, Any] | None = Field(
        default=None,
        description="Several processes: {'world': N, 'states': [rank 1's, ...]}, each rank's "
        "generators (JSON part; tensors under rng/rank<r>/), data position and, mid-epoch, "
        "loss_sum (its running training loss sum).",
    )
    training_step: dict[str, Any] | None = Field(
        default=None,
        description="The step the record was trained with: precision, accumulate_grad_batches, "
        "gradient_clip_val, compile (a resume refuses a changed precision or accumulation).",
    )
    integrity: dict[str, Any] | None = Field(
        default=None,
        description="The digests of the header and of each section of the data: {'header': "
        "'<32 hex>', 'algorithm': 'xxh3-128', 'data_bytes': N, 'sections': {'params': '<32 "
        "hex>', 'buffers': ..., 'optim': ..., 'ema': ..., 'rng': ...}}: 'header' the xxh3-128 "
        "of the header bytes with its own 32 digits zeroed (checked when no manifest lists the "
        "record), each section the xxh3-128 of its tensor bytes in file order (a tensor's "
        "section: its name before the first '/'). Set by the writer; a reader verifies the "
        "sections it reads, nitro verify all of them.",
    )
    tensor_digest: str | None = Field(
        default=None,
        pattern=r"^sha256-8MiB-blocks:[0-9a-f]{64}$",
        description="Records written before 'integrity': sha256 over the sha256 of each "
        "consecutive 8 MiB block of the data section, checked by a load of such a record that "
        "no manifest lists.",
    )
