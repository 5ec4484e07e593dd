"""The experiment a record was written with: its recorded config, with overrides on top.

Validating, averaging with validation and exporting a checkpoint should run the model the
checkpoint was trained as, not the class's defaults. :func:`experiment_from_record` reads the
``config`` a record's header holds (every record, average and export carries one), keeps the
fields the class still has, lays the caller's overrides over them, and names each field that
then differs from the record in a :class:`NitroWarning`. A field the class no longer has is
dropped with a warning; a field added since the record takes its declared default.

``Nitro(exp, weights=...)`` keeps its contract (the experiment the caller passes is the one
built): build that experiment with this function to start from the record's config.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import PydanticSchemaGenerationError, TypeAdapter, ValidationError

from nitro_core.errors import NitroWarning
from nitro_core.experiment import Experiment, config_of, same_value
from nitro_core.sources.lookup import header_in
from nitro_core.store.run import RunStore

E = TypeVar("E", bound=Experiment)


@dataclass(frozen=True)
class RecordConfig:
    """The config a record holds, and where it was read."""

    path: Path | str  # the record whose header was read (an Average's state record; S3: its URL)
    experiment: str | None  # the class name the record was written by
    config: dict[str, Any] | None  # None: the header holds no config


def record_config(source: Any, run_dir: str | Path | RunStore | None = None) -> RecordConfig:
    """The recorded config of the record ``source`` names in ``run_dir`` (for an
    ``Average``, the state record it resolves to). A path needs no ``run_dir``."""
    _, where, meta = header_in(  # of an Average: its state record; on S3 its header alone
        source,
        run_dir,
        "experiment_from_record(cls, {src})",
        "experiment_from_record(cls, {src}, run_dir='runs/MyExp')",
    )
    config = meta.get("config")
    return RecordConfig(
        path=where,
        experiment=meta.get("experiment"),
        config=dict(config) if isinstance(config, Mapping) else None,
    )


def build_from_config(
    cls: type[E], recorded: RecordConfig, overrides: Mapping[str, Any]
) -> tuple[E, list[str]]:
    """``cls`` built from the recorded config with ``overrides`` on top, and one line per
    difference from the record (dropped fields, overridden values, a different class)."""
    notes = []
    name = cls.__name__
    where = str(recorded.path)
    if recorded.experiment is not None and recorded.experiment.rsplit(".", 1)[-1] != name:
        notes.append(f"{where} was written by {recorded.experiment}, not {name}")
    if recorded.config is None:
        notes.append(f"{where} records no config; {name} starts from its defaults")
    config = dict(recorded.config or {})
    for field in sorted(set(config) - set(cls.model_fields)):
        notes.append(
            f"the record's {field}={config.pop(field)!r} is not a field of {name} any more; dropped"
        )
    exp = cls(**{**_from_json(cls, config), **overrides})  # a bad override raises ConfigError
    built = config_of(exp)
    for field in overrides:
        if field in config and not same_value(config[field], built[field]):
            notes.append(
                f"overrides change {field}: {config[field]!r} (record) -> {built[field]!r} (call)"
            )
        elif field not in config and recorded.config is not None:
            default = declared_default(cls, field)
            if default != built[field]:
                notes.append(
                    f"overrides set {field}={built[field]!r}, a field the record does not hold "
                    f"(its default is {default!r})"
                )
    return exp, notes


def experiment_from_record(
    cls: type[E], source: Any, run_dir: str | Path | None = None, **overrides: Any
) -> E:
    """The experiment ``source``'s record was written with: ``cls`` built from the record's
    config with ``overrides`` on top. Each field that then differs from the record (and each
    recorded field ``cls`` no longer has) is named in a :class:`NitroWarning`.

    ``experiment_from_record(Classifier, "latest => best", run_dir="runs/Classifier")``, or
    with a path: ``experiment_from_record(Classifier, "runs/Classifier/epoch0003-....safetensors")``.
    """
    exp, notes = build_from_config(cls, record_config(source, run_dir), overrides)
    for note in notes:
        warnings.warn(note, NitroWarning, stacklevel=2)
    return exp


def _from_json(cls: type[Experiment], config: dict[str, Any]) -> dict[str, Any]:
    """Recorded values (JSON: lists for tuples, values for enums) as the field types the
    strict experiment model takes; a value that does not convert is left for it to refuse."""
    out = {}
    for field, value in config.items():
        annotation = cls.model_fields[field].annotation
        try:
            out[field] = TypeAdapter(annotation or Any).validate_python(value)
        except (ValidationError, PydanticSchemaGenerationError, TypeError):
            out[field] = value
    return out


def declared_default(cls: type[Experiment], field: str) -> Any:
    """The JSON value of ``field``'s declared default."""
    info = cls.model_fields[field]
    if info.is_required():
        return None
    assert info.annotation is not None  # pydantic stores `x: None` as NoneType
    return TypeAdapter(info.annotation).dump_python(
        info.get_default(call_default_factory=True), mode="json"
    )
