"""Run in a fresh process: load a directory with transformers' AutoModelForCausalLM and write
what it found (missing/unexpected keys, dtype, ties) and its logits on the given tokens."""

import json
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, __version__

directory, tokens, out = sys.argv[1:4]
model, info = AutoModelForCausalLM.from_pretrained(
    directory, output_loading_info=True, dtype="auto"
)
model.eval()
ids = torch.tensor(json.loads(tokens))
with torch.no_grad():
    logits = model(input_ids=ids).logits
save_file({"logits": logits.contiguous()}, out + ".safetensors")
emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
report = {
    "version": __version__,
    "missing": sorted(info["missing_keys"]),
    "unexpected": sorted(info["unexpected_keys"]),
    "mismatched": [list(map(str, m)) for m in info.get("mismatched_keys", [])],
    "dtype": str(next(model.parameters()).dtype),
    "tied": emb.data_ptr() == head.data_ptr(),
}
with open(out + ".json", "w") as f:
    json.dump(report, f)
