"""The MCP tools, one module per family; each declares its tools beside what they do.

- :mod:`~nitro_mcp.tools.training_tools`: ``nitro_train``, ``nitro_validate``, ``average``
- :mod:`~nitro_mcp.tools.job_tools`: ``nitro_status``, ``nitro_jobs``, ``nitro_stop``
- :mod:`~nitro_mcp.tools.record_tools`: ``nitro_runs``, ``nitro_manifest``,
  ``nitro_checkpoint_info``, ``nitro_verify``, ``nitro_experiments``
- :mod:`~nitro_mcp.tools.observing_tools`: ``nitro_history``, ``nitro_plot``, ``nitro_compare``
- :mod:`~nitro_mcp.tools.lifecycle_tools`: ``nitro_delete``, ``nitro_export``

Each family's ``register(server, gate)`` adds its tools; :mod:`~nitro_mcp.tools.declare`
is how. The checks the families share are the :class:`~nitro_mcp.gate.Gate`'s.
"""

__all__ = ["declare", "jobs", "lifecycle", "observing", "records", "training"]
