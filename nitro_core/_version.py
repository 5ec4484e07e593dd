"""The one version source: the build reads it (pyproject's [tool.hatch.version]) and
records carry it."""

__version__ = "0.1.0"
