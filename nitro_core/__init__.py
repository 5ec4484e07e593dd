"""Nitro core: experiments, the training loop, trustworthy checkpoint records, keep
selectors and exact resume."""

__version__ = "0.1.0"

from nitro_core.averaging import Averaged, average_checkpoints
from nitro_core.data import TensorBatches
from nitro_core.ema import EMA
from nitro_core.errors import (
    CheckpointCorrupt,
    CheckpointMissing,
    CheckpointNotFound,
    ConfigError,
    DiskFull,
    MissingHookError,
    MonitorError,
    NitroDeprecationWarning,
    NitroError,
    NitroWarning,
    NonFiniteLoss,
    RecordError,
    ResumeRefused,
    SourceSyntaxError,
    TrainingRefused,
    UnsafePath,
)
from nitro_core.experiment import Experiment, Host
from nitro_core.export import export_weights
from nitro_core.handle import Nitro, checkpoint_run
from nitro_core.info import checkpoint_info
from nitro_core.loggers import JSONLLogger, NullLogger
from nitro_core.manifest import ManifestEntry, read_manifest, runs
from nitro_core.selectors import Best, Checkpointer, Epochs, Every, Last, TopKCheckpointer
from nitro_core.sources import Average, parse_source
from nitro_core.stopping import EarlyStopping, Plateau

__all__ = [
    "Average",
    "Averaged",
    "Best",
    "CheckpointCorrupt",
    "CheckpointMissing",
    "CheckpointNotFound",
    "Checkpointer",
    "ConfigError",
    "DiskFull",
    "EMA",
    "EarlyStopping",
    "Epochs",
    "Every",
    "Experiment",
    "Host",
    "JSONLLogger",
    "Last",
    "ManifestEntry",
    "MissingHookError",
    "MonitorError",
    "Nitro",
    "NitroDeprecationWarning",
    "NitroError",
    "NitroWarning",
    "NonFiniteLoss",
    "NullLogger",
    "Plateau",
    "RecordError",
    "ResumeRefused",
    "SourceSyntaxError",
    "TensorBatches",
    "TopKCheckpointer",
    "TrainingRefused",
    "UnsafePath",
    "__version__",
    "average_checkpoints",
    "checkpoint_info",
    "checkpoint_run",
    "export_weights",
    "parse_source",
    "read_manifest",
    "runs",
]
