"""Nitro core: experiments, the training loop, trustworthy checkpoint records, keep
selectors and exact resume.

The public names load lazily (PEP 562): ``import nitro_core`` and ``import
nitro_core.errors`` import no torch; the first use of, say, ``nitro_core.Nitro`` imports
the module that defines it. The layers, each importing only from the ones before it::

    errors -> store/ -> policy/, sources/ -> state/ -> averaging, export, info, deletion, verification
           -> experiment, training/ -> examples/, registry, hf_export -> jobs/
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from nitro_core._version import __version__

_WHERE = {
    "Averaged": "nitro_core.averaging",
    "average_checkpoints": "nitro_core.averaging",
    "CheckpointCorrupt": "nitro_core.errors",
    "CheckpointMissing": "nitro_core.errors",
    "CheckpointNotFound": "nitro_core.errors",
    "ConfigError": "nitro_core.errors",
    "DiskFull": "nitro_core.errors",
    "ObjectStoreError": "nitro_core.errors",
    "MissingHookError": "nitro_core.errors",
    "MonitorError": "nitro_core.errors",
    "NitroDeprecationWarning": "nitro_core.errors",
    "NitroError": "nitro_core.errors",
    "NitroWarning": "nitro_core.errors",
    "NonFiniteLoss": "nitro_core.errors",
    "NotWritable": "nitro_core.errors",
    "RecordError": "nitro_core.errors",
    "ResumeRefused": "nitro_core.errors",
    "SourceSyntaxError": "nitro_core.errors",
    "TrainingRefused": "nitro_core.errors",
    "UnsafePath": "nitro_core.errors",
    "Experiment": "nitro_core.experiment",
    "Host": "nitro_core.experiment",
    "export_weights": "nitro_core.export",
    "export_hf": "nitro_core.hf_export",
    "AverageCall": "nitro_core.jobs.call_models",
    "TrainCall": "nitro_core.jobs.call_models",
    "ValidateCall": "nitro_core.jobs.call_models",
    "checkpoint_info": "nitro_core.info",
    "Best": "nitro_core.policy.selectors",
    "Checkpointer": "nitro_core.policy.selectors",
    "Epochs": "nitro_core.policy.selectors",
    "Every": "nitro_core.policy.selectors",
    "Last": "nitro_core.policy.selectors",
    "TopKCheckpointer": "nitro_core.policy.selectors",
    "Deletion": "nitro_core.deletion",
    "delete_checkpoints": "nitro_core.deletion",
    "Average": "nitro_core.sources.grammar",
    "parse_source": "nitro_core.sources.grammar",
    "EMA": "nitro_core.state.ema",
    "ManifestEntry": "nitro_core.store.manifest",
    "read_manifest": "nitro_core.store.listing",
    "runs": "nitro_core.store.listing",
    "TensorBatches": "nitro_core.training.data",
    "experiment_from_record": "nitro_core.training.from_record",
    "Nitro": "nitro_core.training.handle",
    "checkpoint_run": "nitro_core.training.handle",
    "JSONLLogger": "nitro_core.training.loggers",
    "MLflowLogger": "nitro_core.training.mlflow_logger",
    "NullLogger": "nitro_core.training.loggers",
    "TensorBoardLogger": "nitro_core.training.loggers",
    "WandbLogger": "nitro_core.training.wandb_logger",
    "EarlyStopping": "nitro_core.training.stopping",
    "Plateau": "nitro_core.training.stopping",
    "Checked": "nitro_core.verification",
    "verify": "nitro_core.verification",
}

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ loads them
    from nitro_core.averaging import Averaged as Averaged
    from nitro_core.averaging import average_checkpoints as average_checkpoints
    from nitro_core.deletion import Deletion as Deletion
    from nitro_core.deletion import delete_checkpoints as delete_checkpoints
    from nitro_core.errors import CheckpointCorrupt as CheckpointCorrupt
    from nitro_core.errors import CheckpointMissing as CheckpointMissing
    from nitro_core.errors import CheckpointNotFound as CheckpointNotFound
    from nitro_core.errors import ConfigError as ConfigError
    from nitro_core.errors import DiskFull as DiskFull
    from nitro_core.errors import MissingHookError as MissingHookError
    from nitro_core.errors import MonitorError as MonitorError
    from nitro_core.errors import NitroDeprecationWarning as NitroDeprecationWarning
    from nitro_core.errors import NitroError as NitroError
    from nitro_core.errors import NitroWarning as NitroWarning
    from nitro_core.errors import NonFiniteLoss as NonFiniteLoss
    from nitro_core.errors import NotWritable as NotWritable
    from nitro_core.errors import ObjectStoreError as ObjectStoreError
    from nitro_core.errors import RecordError as RecordError
    from nitro_core.errors import ResumeRefused as ResumeRefused
    from nitro_core.errors import SourceSyntaxError as SourceSyntaxError
    from nitro_core.errors import TrainingRefused as TrainingRefused
    from nitro_core.errors import UnsafePath as UnsafePath
    from nitro_core.experiment import Experiment as Experiment
    from nitro_core.experiment import Host as Host
    from nitro_core.export import export_weights as export_weights
    from nitro_core.hf_export import export_hf as export_hf
    from nitro_core.info import checkpoint_info as checkpoint_info
    from nitro_core.jobs.call_models import AverageCall as AverageCall
    from nitro_core.jobs.call_models import TrainCall as TrainCall
    from nitro_core.jobs.call_models import ValidateCall as ValidateCall
    from nitro_core.policy.selectors import Best as Best
    from nitro_core.policy.selectors import Checkpointer as Checkpointer
    from nitro_core.policy.selectors import Epochs as Epochs
    from nitro_core.policy.selectors import Every as Every
    from nitro_core.policy.selectors import Last as Last
    from nitro_core.policy.selectors import TopKCheckpointer as TopKCheckpointer
    from nitro_core.sources.grammar import Average as Average
    from nitro_core.sources.grammar import parse_source as parse_source
    from nitro_core.state.ema import EMA as EMA
    from nitro_core.store.listing import read_manifest as read_manifest
    from nitro_core.store.listing import runs as runs
    from nitro_core.store.manifest import ManifestEntry as ManifestEntry
    from nitro_core.training.data import TensorBatches as TensorBatches
    from nitro_core.training.from_record import experiment_from_record as experiment_from_record
    from nitro_core.training.handle import Nitro as Nitro
    from nitro_core.training.handle import checkpoint_run as checkpoint_run
    from nitro_core.training.loggers import JSONLLogger as JSONLLogger
    from nitro_core.training.loggers import NullLogger as NullLogger
    from nitro_core.training.loggers import TensorBoardLogger as TensorBoardLogger
    from nitro_core.training.mlflow_logger import MLflowLogger as MLflowLogger
    from nitro_core.training.stopping import EarlyStopping as EarlyStopping
    from nitro_core.training.stopping import Plateau as Plateau
    from nitro_core.training.wandb_logger import WandbLogger as WandbLogger
    from nitro_core.verification import Checked as Checked
    from nitro_core.verification import verify as verify


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'nitro_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "Average",
    "AverageCall",
    "Averaged",
    "Best",
    "Checked",
    "CheckpointCorrupt",
    "CheckpointMissing",
    "CheckpointNotFound",
    "Checkpointer",
    "ConfigError",
    "Deletion",
    "DiskFull",
    "EMA",
    "EarlyStopping",
    "Epochs",
    "Every",
    "Experiment",
    "Host",
    "JSONLLogger",
    "Last",
    "MLflowLogger",
    "ManifestEntry",
    "MissingHookError",
    "MonitorError",
    "Nitro",
    "NitroDeprecationWarning",
    "NitroError",
    "NitroWarning",
    "NonFiniteLoss",
    "NotWritable",
    "NullLogger",
    "ObjectStoreError",
    "Plateau",
    "RecordError",
    "ResumeRefused",
    "SourceSyntaxError",
    "TensorBatches",
    "TensorBoardLogger",
    "TopKCheckpointer",
    "TrainCall",
    "TrainingRefused",
    "UnsafePath",
    "ValidateCall",
    "WandbLogger",
    "__version__",
    "average_checkpoints",
    "checkpoint_info",
    "checkpoint_run",
    "delete_checkpoints",
    "experiment_from_record",
    "export_hf",
    "export_weights",
    "parse_source",
    "read_manifest",
    "runs",
    "verify",
]
