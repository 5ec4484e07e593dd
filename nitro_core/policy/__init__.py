"""Pure decisions over manifest entries: the keep selectors, each carrying its meaning, and
``Checkpointer`` (``selectors``), their bounds (``bounds``), ranking by score (``ranked``),
which entries a checkpointer keeps, with why, and deletes (``retention``), and what a
deletion removes (``deletion``). Nothing here touches a disk."""
