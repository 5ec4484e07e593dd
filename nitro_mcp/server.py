"""The MCP server: Nitro's tools on the official ``mcp`` SDK (``MCPServer``), assembled.

Each tool family in :mod:`nitro_mcp.tools` declares its tools (flat typed parameters with
descriptions, a pydantic reply, so an output schema) over one shared
:class:`~nitro_mcp.gate.Gate`. While the server runs, a watcher starts queued jobs when a
slot frees, whether or not a client is connected (ending workers start them too, so the
queue drains without a server).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer

from nitro_core import __version__
from nitro_core.jobs.call_models import SlurmOptions
from nitro_mcp.experiments import IMPORT_TIMEOUT_S
from nitro_mcp.gate import Gate
from nitro_mcp.replies import NitroServer
from nitro_mcp.tools import (
    job_tools,
    lifecycle_tools,
    observing_tools,
    record_tools,
    training_tools,
)

log = logging.getLogger(__name__)
WATCH_S = 2.0  # how often the server looks for a queued job that can start
FAMILIES = (  # the order of the tool listing
    training_tools,
    job_tools,
    record_tools,
    observing_tools,
    lifecycle_tools,
)

INSTRUCTIONS = """Nitro trains PyTorch experiments and keeps checkpoints you can trust.
Start with nitro_experiments to see what can be trained. nitro_train starts a background
job and returns its job_id at once; follow it with
nitro_status(job_id, wait_s=25, until='end', brief=true) until state is succeeded, failed,
stopped or lost. Checkpoints are named by sources such as
'latest => best', 'a1b2c3d4 => latest' or 'latest => Average(Last(10))'. nitro_validate
evaluates one; average averages several. Jobs survive this connection: nitro_jobs lists them."""


def build_server(
    root: str | Path = ".",
    max_jobs: int = 2,
    experiment_modules: tuple[str, ...] = (),
    max_eval_jobs: int = 2,
    import_timeout_s: float = IMPORT_TIMEOUT_S,
    executor: str = "local",
    slurm_options: SlurmOptions | None = None,
    warm_worker: bool = True,
    storage: str | None = None,
) -> MCPServer:
    """The Nitro MCP server over ``root``: every path resolves inside it. ``max_jobs``
    trainings and, in slots of their own, ``max_eval_jobs`` validations and averages run at
    once; an experiment module's import may take ``import_timeout_s`` seconds.
    ``warm_worker``: validations and averages run in one warm worker (torch imported once).
    ``storage`` (``s3://bucket/prefix``): run directories on object storage under it are
    taken too, every URL confined under it as every path is under ``root``."""
    gate = Gate(
        Path(root), max_jobs=max_jobs, experiment_modules=tuple(experiment_modules),
        max_eval_jobs=max_eval_jobs, import_timeout_s=import_timeout_s,
        executor=executor, slurm_options=slurm_options, warm=warm_worker, storage=storage,
    )  # fmt: skip
    server = NitroServer(  # its tool listing is trimmed for agents
        "nitro", instructions=INSTRUCTIONS, version=__version__, lifespan=_watch_queue(gate)
    )
    for family in FAMILIES:
        family.register(server, gate)
    return server


def _watch_queue(gate: Gate) -> Callable[[MCPServer], Any]:
    """The server's lifespan: a task that starts queued jobs when a slot frees (a worker
    killed without a chance to start the next one, a job queued by another server)."""

    @asynccontextmanager
    async def lifespan(server: MCPServer) -> AsyncIterator[dict[str, Any]]:
        async def watch() -> None:
            while True:
                await anyio.sleep(WATCH_S)
                try:
                    await anyio.to_thread.run_sync(gate.jobs.pump)
                except Exception:  # never take the server down; the next round tries again
                    log.exception("starting queued jobs failed")

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                try:
                    yield {}
                finally:
                    tg.cancel_scope.cancel()
        finally:  # once a pump in flight has returned: the warm worker ends after its job
            gate.jobs.close()

    return lifespan
