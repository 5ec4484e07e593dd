"""Registered experiments: the names a client or a job may use, and nothing else.

The registry holds the built-in examples, the classes advertised under the
``nitro.experiments`` entry-point group by installed packages, and the Experiment
subclasses of modules the operator names when starting a server (``--experiment-module``).
A client's text is only ever looked up here; it never names a module to import.
"""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import entry_points

from nitro_core.errors import ConfigError
from nitro_core.examples import EXAMPLES
from nitro_core.experiment import Experiment

ENTRY_POINT_GROUP = "nitro.experiments"


def load_registry(modules: list[str] | tuple[str, ...] = ()) -> dict[str, type[Experiment]]:
    """Name -> experiment class, from the examples, entry points and operator modules."""
    found: dict[str, type[Experiment]] = dict(EXAMPLES)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        cls = ep.load()
        if inspect.isclass(cls) and issubclass(cls, Experiment):
            found[ep.name] = cls
    for module_name in modules:
        # operator-supplied at server start (never client text): importing is the point
        module = importlib.import_module(module_name)
        for name, cls in vars(module).items():
            if (
                inspect.isclass(cls)
                and issubclass(cls, Experiment)
                and cls.__module__ == module.__name__
            ):
                found[name] = cls
                found[f"{module_name}.{name}"] = cls
    return found


def lookup(registry: dict[str, type[Experiment]], name: str) -> type[Experiment]:
    """The registered class called ``name``, or an error listing the registered names."""
    try:
        return registry[name]
    except KeyError:
        known = ", ".join(sorted(registry))
        raise ConfigError(
            f"Unknown experiment {name!r}; registered experiments are: {known}. Use one of those "
            "names, or register yours with the 'nitro.experiments' entry-point group or "
            "--experiment-module when starting the server."
        ) from None
