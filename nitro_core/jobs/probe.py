"""Questions the server asks of an experiment's code, answered in a process of its own.

The server validates a call's config, but never runs the operator's experiment code
(DESIGN section 16): ``build_model``, ``build_data`` and the hooks can end, crash or patch
the process that runs them. What a refusal at the call needs from them (the model's leaf
shapes on the meta device, the data's split names, the logger backend ``logger()`` returns,
whether ``checkpointer()``'s keep holds a ``restore_best`` average, the monitor) is asked
here: :func:`answer` runs in a child the fork server forks for the question (or, without
one, in ``python -m nitro_core.jobs.probe <request>``), and writes its answer as JSON.

A question is a :class:`Question`: the experiment modules, the registered name, the config
(JSON, as a record holds it; None: the class's defaults) and what is asked. Every answer is
data; an answer that could not be had (the code raised, or the process died) is ``None``,
and the check that needed it is left to the job, which builds the model for real.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nitro_core.errors import NitroError, parts_to_json
from nitro_core.store.atomic import Replace

ASKS = ("shapes", "splits", "logger", "monitor")  # each answered by a hook of its own


class Question(BaseModel):
    """What the server asks of one experiment (its config as JSON; None: its defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    modules: list[str] = Field(default_factory=list)
    experiment: str
    config: dict[str, Any] | None = None
    asks: list[str] = Field(default_factory=list)  # of ASKS
    keep_for: str | None = None  # a restore_best average whose keep is checked
    described: list[str] = Field(default_factory=list)  # more experiments: splits, monitor


def answer(question: Question) -> dict[str, Any]:
    """Each asked thing (None when it could not be had) and, with ``keep_for``, the
    refusal's parts when ``checkpointer()``'s keep cannot hold that average (``keep``)."""
    from nitro_core.registry import load_registry, lookup  # lazy: examples import torch
    from nitro_core.training.from_record import _from_json  # lazy: torch

    out: dict[str, Any] = dict.fromkeys(question.asks)
    try:
        registry = load_registry(question.modules)
    except BaseException:  # noqa: BLE001 - the operator's code: whatever it raises, no answer
        return out
    if question.described:  # each by its own defaults, whatever the others do
        out["described"] = {name: _described(registry, name) for name in question.described}
    try:
        cls = lookup(registry, question.experiment)
        exp = cls(**_from_json(cls, question.config)) if question.config is not None else cls()
    except BaseException:  # noqa: BLE001 - a config that does not build: no answer
        return out
    for ask in question.asks:
        out[ask] = _asked(ask, exp)
    if question.keep_for is not None:
        out["keep"] = _keep(exp, question.keep_for)
    return out


def _asked(ask: str, exp: Any) -> Any:
    try:
        return _ASKED[ask](exp)
    except BaseException:  # noqa: BLE001 - SystemExit from a hook is no answer either
        return None


def _described(registry: Any, name: str) -> dict[str, Any]:
    """An experiment's splits and monitor under its defaults (None: it has none to build)."""
    try:
        exp = registry[name]()
    except BaseException:  # noqa: BLE001 - a field without a default, or worse
        return {"splits": None, "monitor": None}
    return {"splits": _asked("splits", exp), "monitor": _asked("monitor", exp)}


def _shapes(exp: Any) -> dict[str, list[int]]:
    import torch  # lazy

    with torch.device("meta"):
        model = exp.build_model()
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def _splits(exp: Any) -> list[str]:
    return sorted(exp.build_data())


def _logger(exp: Any) -> str | None:
    backend = getattr(exp.logger(), "backend", None)
    return backend if isinstance(backend, str) else None


def _monitor(exp: Any) -> list[Any]:
    return json.loads(json.dumps(list(exp.monitor()), default=str))


_ASKED = {"shapes": _shapes, "splits": _splits, "logger": _logger, "monitor": _monitor}


def _keep(exp: Any, average: str) -> list[Any] | None:
    """The refusal's parts of ``restore_best=<average>`` under the experiment's keep, or
    None when it holds (or the hook could not say)."""
    from nitro_core.sources.grammar import parse_average  # lazy
    from nitro_core.sources.selection import check_keep_holds  # lazy

    try:
        avg = parse_average(average)
        check_keep_holds(exp.checkpointer(), avg, exp.max_epochs)
    except NitroError as exc:
        return parts_to_json(exc.parts)
    except BaseException:  # noqa: BLE001 - the job's own setup says it
        return None
    return None


def write_answer(question: Question, path: Path) -> None:
    """Answer ``question`` into ``path`` (written whole, then renamed into place)."""
    body = json.dumps(answer(question)).encode()
    Replace(path).commit(lambda f: f.write(body))


def main(argv: list[str] | None = None) -> int:
    """``python -m nitro_core.jobs.probe <request.json> <answer.json>``: the cold path."""
    request, out = (sys.argv[1:] if argv is None else argv)[:2]
    question = Question.model_validate_json(Path(request).read_bytes())
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the operator's prints go nowhere
    write_answer(question, Path(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
