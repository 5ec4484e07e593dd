"""Built-in example experiments, used by the demo, the tests and the MCP server.
``HFCausalLM`` (a ``transformers`` model) is registered only when ``transformers`` is
installed (the extra ``nitro[hf]``); it is importable either way."""

from nitro_core.examples.causal_lm import CausalLM
from nitro_core.examples.classifier import Classifier
from nitro_core.examples.hf_causal_lm import HFCausalLM, transformers_installed
from nitro_core.examples.regression import Regression
from nitro_core.experiment import Experiment

EXAMPLES: dict[str, type[Experiment]] = {
    "CausalLM": CausalLM,
    "Classifier": Classifier,
    "Regression": Regression,
}
if transformers_installed():
    EXAMPLES["HFCausalLM"] = HFCausalLM

__all__ = ["EXAMPLES", "CausalLM", "Classifier", "HFCausalLM", "Regression"]
