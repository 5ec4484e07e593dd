"""The handle and its collaborators: ``handle`` (``Nitro``: the handle's state, its phases
and ``train()``), ``build`` (what each phase of construction makes), ``evaluation``
(``validate``/``evaluate``), ``snapshot`` (what a record holds of a handle), ``refusals``
(what ``train()`` refuses before it trains), ``setup`` (run directory, device, splits, Ctrl+C), ``options`` (the loading keywords), ``ranking`` (the monitor and
its setup refusals), ``loop`` (one epoch, evaluation), ``points`` (checkpoint points),
``checkpointing`` (the one record writer; ``sharded_save``, its record-directory format),
``resume`` and ``restore`` (applying records to a handle, averages included),
``stopping``, ``loggers``, ``progress`` and ``data``."""
