"""What a selector may count: the most records it picks and the largest epoch it names (what
a run can hold), checked when a selector is built, and an ``Epochs(...)`` spec read into its
sorted epochs and text."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import TypeGuard

from nitro_core.errors import ConfigError

MAX_EPOCHS = 1_000_000  # the largest epoch number a selector names (what a run can hold)
MAX_COUNT = 100_000  # the most records a selector counts (Best k, Last k, an Epochs set)


def positive(kind: str, name: str, value: object, limit: int = MAX_COUNT) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{kind}({value!r}): {name} must be a positive integer; write {kind}(3).")
    if value > limit:
        raise ConfigError(
            f"{kind}({value}): {name} is at most {limit} ({_LIMIT_REASON[limit]}); write {kind}(3)."
        )


_LIMIT_REASON = {
    MAX_COUNT: "the most records a selector picks",
    MAX_EPOCHS: "a run holds at most that many epochs",
}


def epochs_spec(spec: object) -> tuple[range | tuple[int, ...], str]:
    """The sorted epochs ``spec`` names and their text, refusing what no run can hold."""
    hint = "write Epochs(5), Epochs(range(3, 8)) or Epochs([2, 4, 6])."
    if isinstance(spec, range) and spec.step == 1 and len(spec) > 0:
        epochs: range | tuple[int, ...] = spec
        text = f"{spec.start}:{spec.stop - 1}"
    elif isinstance(spec, int) and not isinstance(spec, bool):
        epochs, text = range(spec, spec + 1), str(spec)
    else:
        values = tuple(itertools.islice(spec, MAX_COUNT + 1)) if _iterable(spec) else (spec,)
        if len(values) > MAX_COUNT:
            raise ConfigError(
                f"Epochs(...) names more than {MAX_COUNT} epochs; a selector picks at most "
                f"{MAX_COUNT} records. Write a range, e.g. Epochs(range(1, {MAX_COUNT + 1}))."
            )
        numbers = [e for e in values if isinstance(e, int) and not isinstance(e, bool)]
        if not values or len(numbers) != len(values):
            raise ConfigError(f"Epochs({_short(repr(spec))}): give positive epoch numbers; {hint}")
        epochs = tuple(sorted(set(numbers)))
        text = "[" + ", ".join(map(str, values)) + "]"
    if not epochs or epochs[0] < 1:
        raise ConfigError(f"Epochs({_short(repr(spec))}): give positive epoch numbers; {hint}")
    if epochs[-1] > MAX_EPOCHS:
        raise ConfigError(
            f"Epochs({_short(text)}) names epoch {epochs[-1]}; a run holds at most {MAX_EPOCHS} "
            f"epochs. Name epochs from 1 to {MAX_EPOCHS}; {hint}"
        )
    if len(epochs) > MAX_COUNT:
        raise ConfigError(
            f"Epochs({_short(text)}) names {len(epochs)} epochs; a selector picks at most {MAX_COUNT} "
            f"records. Name fewer, e.g. Epochs({epochs[0]}:{epochs[0] + MAX_COUNT - 1})."
        )
    return epochs, text


def _iterable(value: object) -> TypeGuard[Iterable[object]]:
    return isinstance(value, Iterable) and not isinstance(value, str | bytes)


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
