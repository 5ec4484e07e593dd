"""A training state to and from tensors and a header: the record layout (``records``),
the header schema (``header``), loading into a model or optimizer (``loading``), every RNG
(``rng``), the EMA (``ema``) and the w0 decay anchor (``anchor``)."""
