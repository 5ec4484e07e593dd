"""The MCP server: Nitro's tools on the official ``mcp`` SDK (``MCPServer``).

Flat typed parameters with descriptions, a pydantic return model per tool (so every tool
has an output schema), and every ``NitroError`` turned into a ``ToolError`` with the same
text; an ``OSError`` the checks did not foresee becomes an actionable ``ToolError`` too.
While the server runs, a watcher starts queued jobs when a slot frees, whether or not a
client is connected (ending workers start them too, so the queue drains without a server).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import pydantic
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from nitro_core import __version__
from nitro_core.errors import NitroError
from nitro_mcp import models
from nitro_mcp.echo import clip
from nitro_mcp.gate import Gate

log = logging.getLogger(__name__)
WATCH_S = 2.0  # how often the server looks for a queued job that can start

INSTRUCTIONS = """Nitro trains PyTorch experiments and keeps checkpoints you can trust.
Start with nitro_experiments to see what can be trained. nitro_train starts a background
job and returns its job_id at once; follow it with nitro_status(job_id, wait_s=20) until
state is succeeded, failed, stopped or lost. Checkpoints are named by sources such as
'latest => best', 'a1b2c3d4 => latest' or 'latest => Average(Last(10))'. nitro_validate
evaluates one; average averages several. Jobs survive this connection: nitro_jobs lists them."""

Source = Annotated[
    str,
    Field(description="A checkpoint source: 'latest => best', '<run id> => latest', 'all => best', "
          "'latest => Average(Last(10))', 'latest => Average(Best(5; among=Last(20)))', or a "
          "path to a .safetensors file inside the root."),
]  # fmt: skip
Overrides = Annotated[
    dict[str, Any] | None,
    Field(description="Experiment config fields to set, e.g. {\"max_epochs\": 3, \"lr\": 0.01}; "
          "nitro_experiments lists each experiment's fields."),
]  # fmt: skip
RunDir = Annotated[
    str | None, Field(description="Run directory inside the root; default runs/<experiment>.")
]
Experiment = Annotated[
    str, Field(description="A registered experiment name (nitro_experiments lists them).")
]


def _tool_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
            if hasattr(result, "__await__"):
                result = await result
            return result
        except NitroError as exc:
            raise ToolError(str(exc)) from exc
        except OSError as exc:  # the file system refused something the checks let through
            where = f" at {clip(exc.filename)}" if exc.filename else ""
            raise ToolError(
                f"{fn.__name__} failed: {exc.strerror or type(exc).__name__}{where}. Check the "
                "path arguments (inside the server's root, names of at most 255 bytes, "
                "directories where a directory is meant) and the disk, then call again."
            ) from exc

    return wrapper


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

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            try:
                yield {}
            finally:
                tg.cancel_scope.cancel()

    return lifespan


async def _off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking gate call (file reads, a worker launch) on a worker thread, so that
    long-polls and other clients are not held up."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args))


def _progress(ctx: Context | None) -> Any:
    if ctx is None:
        return None

    async def send(progress: float, total: float | None, message: str | None) -> None:
        await ctx.report_progress(progress, total, message)

    return send


def build_server(
    root: str | Path = ".", max_jobs: int = 2, experiment_modules: tuple[str, ...] = ()
) -> MCPServer:
    """The Nitro MCP server over ``root``: every path resolves inside it."""
    gate = Gate(Path(root), max_jobs=max_jobs, experiment_modules=tuple(experiment_modules))
    server = MCPServer(
        "nitro", instructions=INSTRUCTIONS, version=__version__, lifespan=_watch_queue(gate)
    )

    @server.tool(description="Start training an experiment as a background job and return at once with "
                 "its job_id (state queued or running). Next: nitro_status(job_id, wait_s=20).")  # fmt: skip
    @_tool_errors
    async def nitro_train(
        experiment: Experiment,
        run_dir: RunDir = None,
        resume: Annotated[
            str,
            Field(
                description="'false' (a new run), 'auto' (continue the latest record, "
                "or start fresh), or a source to resume exactly."
            ),
        ] = "false",
        weights: Annotated[
            str | None,
            Field(
                description="A source whose parameters start a new run "
                "(fresh optimizer), e.g. 'latest => best'."
            ),
        ] = None,
        restore_best: Annotated[
            str,
            Field(
                description="'false', 'true' (end holding the run's best "
                "checkpoint) or 'Average(Last(10))'."
            ),
        ] = "false",
        restore_optimizer: Annotated[
            bool, Field(description="With weights: also take its optimizer state.")
        ] = False,
        strict: Annotated[
            bool, Field(description="False: load weights by name, warning about the rest.")
        ] = True,
        seed: Annotated[
            int | None, Field(description="Seed for every RNG; default 0 (a resume keeps its own).")
        ] = None,
        overrides: Overrides = None,
        device: Annotated[str, Field(description="'auto', 'cpu' or 'cuda:0'.")] = "auto",
    ) -> models.JobHandle:
        return await _off_loop(
            gate.train,
            experiment,
            run_dir,
            resume,
            weights,
            restore_best,
            restore_optimizer,
            strict,
            seed,
            overrides,
            device,
        )

    @server.tool(description="Evaluate a checkpoint on a split. Returns the metrics when the job ends within "
                 "wait_s, otherwise the job_id to follow with nitro_status.")  # fmt: skip
    @_tool_errors
    async def nitro_validate(
        experiment: Experiment,
        run_dir: RunDir = None,
        weights: Source = "latest => best",
        split: Annotated[
            str, Field(description="The data split to evaluate, e.g. 'val' or 'test'.")
        ] = "val",
        load_ema: Annotated[
            bool, Field(description="Evaluate the checkpoint's EMA weights.")
        ] = False,
        overrides: Overrides = None,
        wait_s: Annotated[
            float, Field(description="Seconds to wait for the metrics, 0 to 60.")
        ] = 20,
        ctx: Context | None = None,
    ) -> models.ValidateResult:
        return await gate.validate(
            experiment, run_dir, weights, split, load_ema, overrides, wait_s, _progress(ctx)
        )

    @server.tool(description="Average checkpoints of one run (uniform, streamed in float64). Returns "
                 "averaged_from, the saved path when save is given, and metrics when validate=true.")  # fmt: skip
    @_tool_errors
    async def average(
        run_dir: Annotated[str, Field(description="The run directory inside the root.")],
        source: Annotated[
            str,
            Field(
                description="What to average: 'latest => Average(Last(10))', "
                "'<run id> => Average(Best(5; among=Last(20)))', 'latest => Average(Epochs(8:10))'."
            ),
        ] = "latest => Average(Last(10))",
        save: Annotated[
            str | None,
            Field(
                description="Write the average as a record here (inside the root; "
                "never overwritten)."
            ),
        ] = None,
        experiment: Annotated[str | None, Field(description="Needed with validate=true.")] = None,
        validate: Annotated[bool, Field(description="Also evaluate the average on 'val'.")] = False,
        wait_s: Annotated[
            float, Field(description="Seconds to wait for the result, 0 to 60.")
        ] = 20,
        ctx: Context | None = None,
    ) -> models.AverageResult:
        return await gate.average(
            run_dir, source, save, experiment, validate, wait_s, _progress(ctx)
        )

    @server.tool(description="A job's state (queued, running, succeeded, failed, stopped, lost), phase, epoch, "
                 "step, last loss and validation metrics, the run's kept checkpoints, error and hint, result, "
                 "and a log tail. wait_s (0-25) long-polls until the next epoch or the end, with progress.")  # fmt: skip
    @_tool_errors
    async def nitro_status(
        job_id: Annotated[
            str, Field(description="The job_id nitro_train, nitro_validate or average returned.")
        ],
        wait_s: Annotated[
            float, Field(description="Long-poll up to this many seconds, 0 to 25.")
        ] = 0,
        ctx: Context | None = None,
    ) -> models.JobStatusResult:
        return await gate.status(job_id, wait_s, _progress(ctx))

    @server.tool(description="List jobs, newest first, including those started before this server restarted. "
                 "Paginated: pass next_cursor back as cursor.")  # fmt: skip
    @_tool_errors
    async def nitro_jobs(
        state: Annotated[Literal["queued", "running", "succeeded", "failed", "stopped", "lost"] | None,
                         Field(description="Only jobs in this state.")] = None,
        limit: Annotated[int, Field(description="Jobs per page, 1 to 100.")] = 20,
        cursor: Annotated[str | None, Field(description="next_cursor of the previous page.")] = None,
    ) -> models.JobsPage:  # fmt: skip
        return await _off_loop(gate.list_jobs, state, limit, cursor)

    @server.tool(description="Stop a job. Graceful by default: the epoch finishes, validates and checkpoints "
                 "(stop_reason 'requested'). force=true kills it now; the run stays resumable with resume='auto'.")  # fmt: skip
    @_tool_errors
    async def nitro_stop(
        job_id: Annotated[str, Field(description="The job to stop.")],
        force: Annotated[
            bool, Field(description="Kill at once instead of stopping after the epoch.")
        ] = False,
    ) -> models.StopResult:
        return await _off_loop(gate.stop, job_id, force)

    @server.tool(description="The runs a run directory holds: each run's checkpoints, epochs, best score, "
                 "latest file and stop reason. Name one in a source as '<run> => best'.")  # fmt: skip
    @_tool_errors
    async def nitro_runs(
        run_dir: Annotated[str, Field(description="A run directory inside the root.")],
    ) -> models.RunsResult:
        return await _off_loop(gate.runs, run_dir)

    @server.tool(description="The manifest of a run directory: one entry per kept checkpoint (file, epoch, "
                 "step, score, metric, mode, stop_reason, run, parent, written, bytes, sha256). Paginated.")  # fmt: skip
    @_tool_errors
    async def nitro_manifest(
        run_dir: Annotated[str, Field(description="A run directory inside the root.")],
        limit: Annotated[int, Field(description="Entries per page, 1 to 200.")] = 50,
        cursor: Annotated[
            str | None, Field(description="next_cursor of the previous page.")
        ] = None,
    ) -> models.ManifestPage:
        return await _off_loop(gate.manifest_page, run_dir, limit, cursor)

    @server.tool(description="A checkpoint's header without loading its tensors: epoch, step, seed, run, config, "
                 "metrics, stop_reason, averaged_from and a layout summary.")  # fmt: skip
    @_tool_errors
    async def nitro_checkpoint_info(
        path: Annotated[str, Field(description="A .safetensors record inside the root.")],
    ) -> models.CheckpointInfoResult:
        return await _off_loop(gate.checkpoint_info, path)

    @server.tool(description="The registered experiments: name, description, config fields with types, "
                 "defaults and Host marks (Host fields may change on resume), data splits and monitor.")  # fmt: skip
    @_tool_errors
    async def nitro_experiments() -> models.ExperimentsResult:
        return await _off_loop(gate.experiments)

    _forbid_unknown_arguments(server)
    return server


def _forbid_unknown_arguments(server: MCPServer) -> None:
    """Make a misspelled argument an error instead of a silently ignored one: the SDK's
    argument models ignore extra keys, so each tool's model is replaced by a subclass that
    forbids them (and says so in its schema)."""
    for tool in server._tool_manager.list_tools():  # no public hook for this in mcp 2.3
        base = tool.fn_metadata.arg_model
        names = [info.alias or field for field, info in base.model_fields.items()]  # as sent

        def check(cls: Any, data: Any, names: list[str] = names, tool: str = tool.name) -> Any:
            if isinstance(data, dict):
                unknown = sorted(set(data) - set(names))
                if unknown:
                    raise ValueError(
                        f"unknown argument {unknown[0]!r}; {tool} takes: {', '.join(names)}"
                    )
            return data

        # pydantic makes ``check`` a classmethod (its first parameter is ``cls``); the
        # descriptor it returns is what create_model takes, though typed there as a callable
        validators: dict[str, Any] = {"_known": pydantic.model_validator(mode="before")(check)}
        strict = pydantic.create_model(base.__name__, __base__=base, __validators__=validators)
        strict.model_config["extra"] = "forbid"
        strict.model_rebuild(force=True)
        tool.fn_metadata.arg_model = strict
        tool.parameters = strict.model_json_schema(by_alias=True)
