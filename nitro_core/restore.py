"""Applying records to a handle: a full resume, a weights load, and ``restore_best``.

A full resume restores everything the next step depends on and refuses, with a diff, what
would make it inexact. A weights load takes parameters and layer state into a new run.
``restore_best`` swaps the run's own best (or averaged) checkpoint in at the end of
``train()`` and then refuses further training.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from nitro_core import manifest, records, rng, store
from nitro_core.errors import ConfigError, NitroWarning, ResumeRefused, TrainingRefused
from nitro_core.experiment import config_diff
from nitro_core.loading import load_model_state, load_optimizer_fresh_schedule
from nitro_core.manifest import ManifestEntry
from nitro_core.records import Record
from nitro_core.resolve import Resolved, pick_best, resolve
from nitro_core.resume import ResumePoint
from nitro_core.sources import Average, Pair, RunRef, Source

if TYPE_CHECKING:
    from nitro_core.handle import Nitro


def restore_full(n: Nitro, point: ResumePoint) -> tuple[dict[str, Any] | None, rng.RngState]:
    """Load the full training state of ``point`` into ``n``; returns the logger state and the
    recorded RNG state, which the handle restores when ``train()`` starts (a draw between
    construction and training must not move the resumed trajectory)."""
    _check_anchor(n, point)
    point.check_layout(records.model_layout(n.model, n.optimizer), n.logger.backend)
    rec = point.load()
    meta = rec.meta
    n.model.load_state_dict(rec.model_state())
    n.optimizer.load_state_dict(rec.tree("optimizer"))
    if n.scheduler is not None and meta.get("scheduler") is not None:
        n.scheduler.load_state_dict(rec.tree("scheduler"))
    if n.plateau is not None and meta.get("plateau") is not None:
        n.plateau.load_state_dict(rec.tree("plateau"))
    if n.early_stopper is not None and meta.get("early_stopping") is not None:
        n.early_stopper.load_state_dict(meta["early_stopping"])
    ema_state = rec.ema_state()
    if n.ema is not None and ema_state is not None:
        n.ema.load(ema_state, meta["ema_meta"]["num_updates"])
    n.step, n.epoch = meta["step"], meta["epoch"]
    n.history = list(meta.get("history", []))
    n.averaged_from = meta.get("averaged_from")
    return meta["logger"]["state"], (meta["rng"], rec.rng_tensors())


def _check_anchor(n: Nitro, point: ResumePoint) -> None:
    recorded = point.meta.get("decay_anchor", "zero")
    current = n.experiment.decay_anchor()
    if recorded != current:
        raise ResumeRefused(
            f"Cannot resume {point.file!r}: it was trained with decay_anchor() == {recorded!r}, "
            f"the experiment now returns {current!r}. Return {recorded!r} from decay_anchor() to "
            "resume, or start a new run that takes only the weights: Nitro(exp, weights=...)."
        )
    if current == "w0" and point.meta.get("w0_checksum") != n.anchor.checksum:
        raise ResumeRefused(
            f"Cannot resume {point.file!r}: its decay anchor w0 has checksum "
            f"{str(point.meta.get('w0_checksum'))[:12]}..., but build_model() with seed {n.seed} "
            f"now builds initial weights with checksum {n.anchor.checksum[:12]}..., so decay "
            "would pull toward other weights. Restore the initialization the record was trained "
            "with, or start a new run that takes only the weights: Nitro(exp, weights=...)."
        )


def read(resolved: Resolved) -> Record:
    """A resolved record's tensors, checked against its manifest sha256 when listed."""
    tensors, meta = store.read_record(
        resolved.path, resolved.entry.sha256 if resolved.entry else None
    )
    return Record(meta=meta, tensors=tensors)


def load_weights(n: Nitro, source: Source, entries: list[ManifestEntry]) -> None:
    """Parameters and layer state (or the EMA copy) of ``source`` into a new run."""
    opts = n.options
    name = type(n.experiment).__name__
    if isinstance(source, Pair) and isinstance(source.pick, Average):
        from nitro_core.averaging import load_average

        load_average(n, source, entries)
        return
    resolved = resolve(source, n.run_dir, entries, n.ranking.pair)
    rec = read(resolved)
    warn_config_changed(rec.meta, n, str(resolved.path))
    state = rec.ema_state() if opts.load_ema else rec.model_state()
    if state is None:
        raise ConfigError(
            f"load_ema=True, but {str(resolved.path)!r} keeps no EMA (its experiment's ema() "
            "returned None). Drop load_ema to load its parameters."
        )
    load_model_state(n.model, state, opts.strict, str(resolved.path), name)
    if n.ema is not None:
        n.ema.reset()
    if opts.restore_optimizer:
        if rec.meta.get("optimizer") is None:  # an export or an average: weights only
            raise ConfigError(
                f"restore_optimizer=True, but {str(resolved.path)!r} holds weights only (an "
                "export or an average), no optimizer state. Drop restore_optimizer to load its "
                "weights with a fresh optimizer."
            )
        recorded = rec.meta["layout"]["groups"]
        current = records.model_layout(n.model, n.optimizer)["groups"]
        if recorded != current:
            raise ConfigError(
                f"restore_optimizer=True: the optimizer groups of {str(resolved.path)!r} "
                f"({recorded}) differ from this optimizer's ({current}); the state would land on "
                "the wrong parameters. Build the optimizer with the same groups, or drop "
                "restore_optimizer."
            )
        load_optimizer_fresh_schedule(n.optimizer, rec.tree("optimizer"))
    n.checkpoint_source = resolved.path
    n.averaged_from = rec.meta.get("averaged_from")


def warn_config_changed(meta: dict[str, Any], n: Nitro, origin: str) -> None:
    """A weights load only warns about a changed plain config (the spec): it builds the
    model from the current experiment, so old weights under another graph are allowed."""
    diff = config_diff(meta["config"], n.experiment) if meta.get("config") else []
    if diff:
        warnings.warn(
            f"weights from {origin} were trained under another config:\n"
            + "\n".join(diff)
            + "\nLoading them into the current experiment as asked.",
            NitroWarning,
            stacklevel=5,
        )


class BestRestorer:
    """``restore_best``: after training, hold the run's own best (or averaged) checkpoint."""

    def __init__(self, n: Nitro, spec: bool | Average) -> None:
        self.n = n
        self.spec = spec
        self.holding: ManifestEntry | str | None = None
        if spec is not False and n.checkpointer is None:
            raise ConfigError(
                f"restore_best={spec} needs checkpoints, but {type(n.experiment).__name__}."
                "checkpointer() returns None. Return a Checkpointer, or drop restore_best."
            )
        if isinstance(spec, Average):
            from nitro_core.averaging import check_keep_holds

            check_keep_holds(n.checkpointer, spec, n.experiment.max_epochs)

    def apply(self) -> None:
        if self.spec is False or self.holding is not None:
            return
        n = self.n
        entries = manifest.read_manifest(n.run_dir)
        own = manifest.run_entries(entries, n.run_id)
        if isinstance(self.spec, Average):
            from nitro_core.averaging import restore_average

            self.holding = restore_average(n, self.spec, entries)
            return
        scored = [e for e in own if e.score is not None and e.pair == n.ranking.pair]
        if not scored:
            warnings.warn(
                f"restore_best=True: run {n.run_id} has no scored checkpoint in "
                f"{str(n.run_dir)!r}, so the handle keeps its final weights.",
                NitroWarning,
                stacklevel=3,
            )
            return
        source = Pair(RunRef("id", n.run_id), "best")
        best = pick_best(source, own, n.ranking.pair, str(n.run_dir))
        rec = read(Resolved(source, n.run_dir / best.file, best))
        n.model.load_state_dict(rec.model_state())
        ema_state = rec.ema_state()
        if n.ema is not None and ema_state is not None:
            n.ema.load(ema_state, rec.meta["ema_meta"]["num_updates"])
        n.checkpoint_source = n.run_dir / best.file
        self.holding = best

    def refuse_training(self) -> None:
        if self.holding is None:
            return
        n = self.n
        exp = f"{type(n.experiment).__name__}(...)"
        where = f"run_dir={str(n.run_dir)!r}"
        what = (
            f"its best checkpoint (epoch {self.holding.epoch}, {self.holding.metric}={self.holding.score:.6g})"
            if isinstance(self.holding, ManifestEntry)
            else f"its average {self.holding}"
        )
        pick = "best" if isinstance(self.holding, ManifestEntry) else self.holding
        raise TrainingRefused(
            f"This handle ended train() holding run {n.run_id}'s {what} rather than its final "
            f"state (epoch {n.epoch}); those weights beside the final optimizer state are not a "
            "state any run was in, so it will not train further. To continue from it, write "
            "one of:\n"
            + (
                f"  Nitro({exp}, {where}, resume='{n.run_id} => best')  # exact: its optimizer, step and RNG, as a new branch\n"
                if isinstance(self.holding, ManifestEntry)
                else ""
            )
            + f"  Nitro({exp}, {where}, weights='{n.run_id} => {pick}')  # its weights, a fresh optimizer and schedule\n"
            + (
                f"  Nitro({exp}, {where}, weights='{n.run_id} => best', restore_optimizer=True)  # its weights and optimizer state, a fresh schedule"
                if isinstance(self.holding, ManifestEntry)
                else f"  Nitro({exp}, {where}, weights='{n.run_id} => {pick}', load_ema=True)  # the average of its EMAs"
            )
        )
