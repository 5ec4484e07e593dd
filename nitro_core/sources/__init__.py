"""Naming a checkpoint: the whitelist grammar (``grammar``: tokenizer, one function per
rule, frozen AST), what an ``Average`` names in a run's history and whether a keep can
hold it (``selection``), and resolving a source to record files from the manifest alone
(``resolve``)."""
