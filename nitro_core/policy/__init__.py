"""Pure decisions over manifest entries: the keep selectors and ``Checkpointer``
(``selectors``), and which entries a checkpointer keeps, with why, and deletes
(``retention``). Nothing here touches a disk."""
