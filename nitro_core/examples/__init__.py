"""Built-in example experiments, used by the demo, the tests and the MCP server."""

from nitro_core.examples.causal_lm import CausalLM
from nitro_core.examples.classifier import Classifier
from nitro_core.examples.regression import Regression
from nitro_core.experiment import Experiment

EXAMPLES: dict[str, type[Experiment]] = {
    "CausalLM": CausalLM,
    "Classifier": Classifier,
    "Regression": Regression,
}

__all__ = ["EXAMPLES", "CausalLM", "Classifier", "Regression"]
