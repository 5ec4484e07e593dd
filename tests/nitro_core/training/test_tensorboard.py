"""TensorBoardLogger: event files beside the JSONL log, chosen by Nitro(logger=...), and a
resume that continues the same event stream (no event past the record appears twice)."""

from __future__ import annotations

import json
import sys
import time

import pytest

from nitro_core import ConfigError, JSONLLogger, Nitro, ResumeRefused, TensorBoardLogger

from ..tiny import Tiny

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)


class Killed(Exception):
    """Stands for a SIGKILL between an epoch's log row and its record."""


def scalars(tb_dir, tag):
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def killed_at_epoch(epoch, run_dir, **kw):
    """Train until ``epoch`` has been logged, then die before its record is written."""
    n = Nitro(Tiny(max_epochs=4), run_dir=run_dir, **kw)
    save = n._parts.writer.save

    def dying(e, *args, **kwargs):
        if e == epoch:
            raise Killed
        return save(e, *args, **kwargs)

    n._parts.writer.save = dying
    with pytest.raises(Killed):
        n.train()
    return n


def test_tensorboard_logger_writes_one_scalar_per_epoch_and_keeps_the_jsonl_log(tmp_path):
    n = Nitro(Tiny(), run_dir=tmp_path, logger="tensorboard").train()
    tb = tmp_path / "logs" / "tb" / n.run_id
    assert isinstance(n.logger, TensorBoardLogger) and n.logger.backend == "tensorboard"
    assert scalars(tb, "train_loss") == [
        (row["step"], pytest.approx(row["train_loss"])) for row in n.history
    ]
    assert scalars(tb, "val/loss") == [
        (row["step"], pytest.approx(row["val"]["loss"])) for row in n.history
    ]
    assert [v for _, v in scalars(tb, "epoch")] == [1, 2, 3]
    lines = (tmp_path / "logs" / f"{n.run_id}.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2, 3]


def test_resume_after_a_kill_continues_the_event_stream_without_duplicates(tmp_path):
    first = killed_at_epoch(3, tmp_path, logger="tensorboard")  # epoch 3 logged, not recorded
    tb = tmp_path / "logs" / "tb" / first.run_id
    assert [s for s, _ in scalars(tb, "train_loss")] == [4, 8, 12]
    resumed = Nitro(Tiny(max_epochs=4), run_dir=tmp_path, resume="auto", logger="tensorboard")
    assert resumed.run_id == first.run_id and resumed.epoch == 2
    resumed.train()
    assert scalars(tb, "train_loss") == [
        (row["step"], pytest.approx(row["train_loss"])) for row in resumed.history
    ]
    assert [v for _, v in scalars(tb, "epoch")] == [1, 2, 3, 4]
    assert len(list(tb.glob("events.out.tfevents.*"))) == 2  # the resume opened a new file
    lines = (tmp_path / "logs" / f"{first.run_id}.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2, 3, 4]


def test_the_resumed_event_file_sorts_after_the_killed_runs_file_in_the_same_second(tmp_path):
    """Readers replay event files in name order, and a name starts with the whole second it
    was made in: a resume within that second must still sort after (here the killed run's
    file is renamed as though another host, whose name sorts last, wrote it just now)."""
    first = killed_at_epoch(3, tmp_path, logger="tensorboard")
    tb = tmp_path / "logs" / "tb" / first.run_id
    (old,) = tb.glob("events.out.tfevents.*")
    old.rename(tb / f"events.out.tfevents.{int(time.time()):010d}.~host.1.0")
    Nitro(Tiny(max_epochs=4), run_dir=tmp_path, resume="auto", logger="tensorboard").train()
    assert [s for s, _ in scalars(tb, "train_loss")] == [4, 8, 12, 16]


def test_the_experiments_logger_hook_can_return_a_tensorboard_logger(tmp_path):
    class Boarded(Tiny):
        def logger(self):
            return TensorBoardLogger()

    n = Nitro(Boarded(max_epochs=1), run_dir=tmp_path).train()
    assert n.logger.backend == "tensorboard"
    assert list((tmp_path / "logs" / "tb" / n.run_id).glob("events.out.tfevents.*"))


def test_the_logger_keyword_overrides_the_experiments_hook(tmp_path):
    class Boarded(Tiny):
        def logger(self):
            return TensorBoardLogger()

    n = Nitro(Boarded(max_epochs=1), run_dir=tmp_path, logger="jsonl").train()
    assert isinstance(n.logger, JSONLLogger)
    assert not (tmp_path / "logs" / "tb").exists()
    mine = JSONLLogger()
    assert Nitro(Tiny(), run_dir=tmp_path / "b", logger=mine).logger is mine


def test_a_resume_with_another_logger_backend_is_refused(tmp_path):
    Nitro(Tiny(max_epochs=1), run_dir=tmp_path, logger="tensorboard").train()
    with pytest.raises(ResumeRefused, match="its logger state is for the 'tensorboard' backend"):
        Nitro(Tiny(max_epochs=2), run_dir=tmp_path, resume="auto", logger="jsonl")


def test_a_handle_that_only_evaluates_writes_no_event_file(tmp_path):
    Nitro(Tiny(max_epochs=1), run_dir=tmp_path / "a").train()
    n = Nitro(Tiny(), run_dir=tmp_path / "b", weights=str(next((tmp_path / "a").glob("*.safetensors"))),
              logger="tensorboard")  # fmt: skip
    n.evaluate("val")
    n.close()
    assert not (tmp_path / "b" / "logs").exists()


@pytest.mark.parametrize("choice", ["tb", 3, object()])
def test_an_unknown_logger_choice_is_refused(tmp_path, choice):
    with pytest.raises(ConfigError) as err:
        Nitro(Tiny(), run_dir=tmp_path, logger=choice)
    assert str(err.value) == (
        f"Nitro(logger={choice!r}) is not a logger; write logger='jsonl', 'tensorboard', "
        "'mlflow' or 'wandb', a logger instance such as TensorBoardLogger(), or leave it out "
        "to use Tiny.logger()."
    )


def test_without_tensorboard_installed_the_logger_is_refused_with_how_to_install(
    tmp_path, monkeypatch
):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard now fails
    with pytest.raises(ConfigError) as err:
        Nitro(Tiny(), run_dir=tmp_path, logger="tensorboard")
    assert str(err.value) == (
        "TensorBoardLogger needs the tensorboard package, which is not installed: pip install "
        "'nitro[tensorboard]' (or pip install 'tensorboard>=2.14'). Or log with JSONLLogger() "
        "(logger='jsonl')."
    )
