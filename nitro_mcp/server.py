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
from typing import Annotated, Any, Literal, TypeVar

import anyio
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import TextContent
from pydantic import BaseModel, Field, StrictBool

from nitro_core import __version__
from nitro_core.errors import NitroError
from nitro_core.jobs.call_models import AverageCall, Refusal, SlurmOptions, TrainCall, ValidateCall
from nitro_mcp import models, observe
from nitro_mcp.arguments import arguments_model, flat, signature_model
from nitro_mcp.echo import clip
from nitro_mcp.experiments import IMPORT_TIMEOUT_S
from nitro_mcp.gate import Gate
from nitro_mcp.refusals import for_tool
from nitro_mcp.replies import NitroServer, compact

log = logging.getLogger(__name__)
C = TypeVar("C", bound=BaseModel)
WATCH_S = 2.0  # how often the server looks for a queued job that can start

INSTRUCTIONS = """Nitro trains PyTorch experiments and keeps checkpoints you can trust.
Start with nitro_experiments to see what can be trained. nitro_train starts a background
job and returns its job_id at once; follow it with
nitro_status(job_id, wait_s=25, until='end', brief=true) until state is succeeded, failed,
stopped or lost. Checkpoints are named by sources such as
'latest => best', 'a1b2c3d4 => latest' or 'latest => Average(Last(10))'. nitro_validate
evaluates one; average averages several. Jobs survive this connection: nitro_jobs lists them."""


def _wait(most: int, what: str, default: float) -> Any:
    """A ``wait_s`` parameter: 0 to ``most`` seconds."""
    return (
        Annotated[
            float,
            Field(ge=0, le=most, description=f"Seconds to wait for {what}."),
            Refusal(f"wait_s={{value}} is out of range; give 0 to {most} seconds."),
        ],
        default,
    )


def _limit_refusal(most: int) -> Refusal:
    return Refusal(f"limit={{value}} is out of range; give 1 to {most}.")


JobsLimit = Annotated[int, Field(ge=1, le=100, description="Per page."), _limit_refusal(100)]
RunsLimit = Annotated[int, Field(ge=1, le=100, description="Per page."), _limit_refusal(100)]
EntriesLimit = Annotated[int, Field(ge=1, le=200, description="Per page."), _limit_refusal(200)]


TrainArguments = arguments_model(
    "nitro_train",
    TrainCall,
    after_running=(StrictBool, Field(default=False, description="When a job already trains "
                   "run_dir: queue this one to start when it ends (false: refuse).")),
)  # fmt: skip
ValidateArguments = arguments_model(
    "nitro_validate", ValidateCall, wait_s=_wait(60, "the metrics", 20)
)
AverageArguments = arguments_model("average", AverageCall, wait_s=_wait(60, "the result", 20))
Cursor = Annotated[str | None, Field(description="A next_cursor.")]


def _call(model: type[C], arguments: BaseModel) -> C:
    """The call in a tool's arguments: the fields of ``model``, without the tool's own."""
    return model.model_validate(arguments.model_dump(include=set(model.model_fields)))


def _tool(
    server: NitroServer, description: str, arguments: type[BaseModel] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a tool function: with ``arguments`` (a call model's), ``fn(arguments, ctx)``
    takes that model's fields flat; without, the function's own parameters."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        model = arguments or signature_model(fn)
        tool = fn if arguments is None else flat(fn, model)
        server.add_nitro_tool(_tool_errors(tool), model, description)
        return fn

    return register


def _tool_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
            if hasattr(result, "__await__"):
                result = await result
            return compact(result)  # compact JSON text beside the structured content
        except NitroError as exc:  # what to send instead, written as this tool's arguments
            raise ToolError(for_tool(exc, fn.__name__)) from exc
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
    root: str | Path = ".",
    max_jobs: int = 2,
    experiment_modules: tuple[str, ...] = (),
    max_eval_jobs: int = 2,
    import_timeout_s: float = IMPORT_TIMEOUT_S,
    executor: str = "local",
    slurm_options: SlurmOptions | None = None,
) -> MCPServer:
    """The Nitro MCP server over ``root``: every path resolves inside it. ``max_jobs``
    trainings and, in slots of their own, ``max_eval_jobs`` validations and averages run at
    once; an experiment module's import may take ``import_timeout_s`` seconds."""
    gate = Gate(
        Path(root), max_jobs=max_jobs, experiment_modules=tuple(experiment_modules),
        max_eval_jobs=max_eval_jobs, import_timeout_s=import_timeout_s,
        executor=executor, slurm_options=slurm_options,
    )  # fmt: skip
    server = NitroServer(  # its tool listing is trimmed for agents
        "nitro", instructions=INSTRUCTIONS, version=__version__, lifespan=_watch_queue(gate)
    )

    @_tool(server, "Start training as a background job; returns its job_id at once. Next: "
           "nitro_status(job_id, wait_s=25, until='end', brief=true).",
           TrainArguments)  # fmt: skip
    async def nitro_train(arguments: Any, ctx: Context | None) -> models.JobHandle:
        return await _off_loop(gate.train, _call(TrainCall, arguments), arguments.after_running)

    @_tool(server, "Evaluate a checkpoint on a split: its metrics if the job ends within wait_s, "
           "else the job_id for nitro_status.", ValidateArguments)  # fmt: skip
    async def nitro_validate(arguments: Any, ctx: Context | None) -> models.ValidateResult:
        call = _call(ValidateCall, arguments)
        return await gate.validate(call, arguments.wait_s, _progress(ctx))

    @_tool(server, "Average checkpoints of one run (uniform, float64, streamed); save and "
           "validate the average if asked.",
           AverageArguments)  # fmt: skip
    async def average(arguments: Any, ctx: Context | None) -> models.AverageResult:
        call = _call(AverageCall, arguments)
        return await gate.average(call, arguments.wait_s, _progress(ctx))

    @_tool(server, "A job's state, progress, last metrics, kept checkpoints and log tail; wait_s "
                 "long-polls (to follow a job: wait_s=25, until='end', brief=true).")  # fmt: skip
    async def nitro_status(
        job_id: Annotated[str, Field(description="From nitro_train, nitro_validate or average.")],
        wait_s: Annotated[
            float,
            Field(ge=0, le=25, description="Long-poll seconds."),
            Refusal("wait_s={value} is out of range; give 0 to 25 seconds."),
        ] = 0,
        until: Annotated[
            Literal["change", "end"],
            Field(description="change: also at an epoch's end; end: only at the job's end."),
            Refusal(
                "until={value} is not a way to wait; write until='end' (return when the job "
                "ends or wait_s passes) or until='change' (also at each epoch's end)."
            ),
        ] = "change",
        brief: Annotated[
            StrictBool,
            Field(description="Only state, epoch, step, progress, last metrics, error and next."),
        ] = False,
        ctx: Context | None = None,
    ) -> models.JobStatusResult:
        return await gate.status(job_id, wait_s, _progress(ctx), until, brief)

    @_tool(server, "Jobs, newest first, also those from before a server restart; pass next_cursor "
                 "back as cursor.")  # fmt: skip
    async def nitro_jobs(
        state: Annotated[Literal["queued", "running", "succeeded", "failed", "stopped", "lost"] | None,
                         Field(description="Only jobs in this state.")] = None,
        limit: JobsLimit = 20,
        cursor: Cursor = None,
        prune_older_than_h: Annotated[float | None, Field(
            description="Remove jobs ended over this many hours ago.")] = None,
        dry_run: Annotated[StrictBool, Field(description="false: prune for real.")] = True,
    ) -> models.JobsPage:  # fmt: skip
        return await _off_loop(gate.list_jobs, state, limit, cursor, prune_older_than_h, dry_run)

    @_tool(server, "Stop a job after its epoch (validated, checkpointed); force=true kills it now. "
                 "resume='auto' continues the run.")  # fmt: skip
    async def nitro_stop(
        job_id: Annotated[str, Field(description="The job to stop.")],
        force: Annotated[StrictBool, Field(description="Kill now, not after the epoch.")] = False,
    ) -> models.StopResult:
        return await _off_loop(gate.stop, job_id, force)

    @_tool(server, "Without run_dir: the run directories under the root; with it: its runs "
                 "(checkpoints, epochs, best, parent), named as '<run> => best'.")  # fmt: skip
    async def nitro_runs(
        run_dir: Annotated[str | None, Field(description="Omit to list them all.")] = None,
        limit: RunsLimit = 20,
        cursor: Cursor = None,
    ) -> models.RunsResult:
        return await _off_loop(gate.runs, run_dir, limit, cursor)

    @_tool(server, "Compare 2 to 8 runs: differing config fields, best and final metrics, epochs, "
                 "wall time, parent.")  # fmt: skip
    async def nitro_compare(
        sources: Annotated[
            list[str],
            Field(description="'runs/a' (latest run), 'runs/a:<run id>', 'runs/a:all'."),
        ],
    ) -> models.CompareResult:  # fmt: skip
        return await _off_loop(gate.compare, sources)

    @_tool(server, "Delete a run or some records: a dry run unless dry_run=false; refused while a "
                 "job uses the run.")  # fmt: skip
    async def nitro_delete(
        run_dir: Annotated[str, Field(description="A run directory.")],
        run: Annotated[
            str | None, Field(description="A run id (omit with files: every run).")
        ] = None,
        files: Annotated[
            list[str] | None, Field(description="Record file names (nitro_manifest lists them).")
        ] = None,
        dry_run: Annotated[StrictBool, Field(description="false: really delete.")] = True,
    ) -> models.DeleteResult:
        return await _off_loop(gate.delete, run_dir, run, files, dry_run)

    @_tool(server, "Write a checkpoint's weights to a new .safetensors file (state-dict names, "
                 "provenance), or a Hugging Face model directory (format='hf').")  # fmt: skip
    async def nitro_export(
        source: Annotated[str, Field(description="e.g. 'latest => best', or a path.")],
        path: Annotated[
            str,
            Field(description="A new .safetensors file (format='hf': a new directory)."),
        ],
        run_dir: Annotated[str | None, Field(description="The source's run directory.")] = None,
        format: Annotated[
            Literal["weights", "hf"],
            Field(description="'hf': config.json and model.safetensors (or shards)."),
        ] = "weights",
        dtype: Annotated[
            Literal["float32", "float16", "bfloat16"] | None,
            Field(description="format='hf': cast floating weights to this dtype."),
        ] = None,
        max_shard_size: Annotated[
            str,
            Field(
                description="format='hf': the largest shard, e.g. '5GB', '500MB'.", max_length=20
            ),
        ] = "5GB",
    ) -> models.ExportResult:
        return await _off_loop(gate.export, source, path, run_dir, format, dtype, max_shard_size)

    @_tool(server, "A run directory's manifest, paginated: one entry per kept checkpoint.")  # fmt: skip
    async def nitro_manifest(
        run_dir: Annotated[str, Field(description="A run directory.")],
        limit: EntriesLimit = 20,
        cursor: Cursor = None,
    ) -> models.ManifestPage:
        return await _off_loop(gate.manifest_page, run_dir, limit, cursor)

    @_tool(server, "A checkpoint's header, no tensors read: epoch, step, seed, run, config, "
                 "metrics, averaged_from, layout.")  # fmt: skip
    async def nitro_checkpoint_info(
        path: Annotated[str, Field(description="A record.")],
    ) -> models.CheckpointInfoResult:
        return await _off_loop(gate.checkpoint_info, path)

    @_tool(server, "Check every byte of a record, or of each record of a run directory, "
                 "against its digests.")  # fmt: skip
    async def nitro_verify(
        path: Annotated[str, Field(description="A record or a run directory.")],
    ) -> models.VerifyResult:
        return await _off_loop(gate.verify, path)

    @_tool(server, "Registered experiments: config fields (type, default; Host ones may change on "
                 "resume), splits, monitor; and module import errors.")  # fmt: skip
    async def nitro_experiments(
        name: Annotated[str | None, Field(description="One; default all.")] = None,
    ) -> models.ExperimentsResult:
        return await _off_loop(gate.experiments, name)

    @_tool(server, "A run's metrics per epoch from its log (epoch, step, train_loss, lr, "
                 "val.<metric>, seconds), newest last, bounded.")  # fmt: skip
    async def nitro_history(
        run_dir: Annotated[str, Field(description="A run directory.")],
        run: Annotated[str | None, Field(description="Default the run that logged last.")] = None,
        columns: Annotated[
            list[str] | None, Field(description="e.g. ['epoch', 'val.loss']; default all.")
        ] = None,
        every: Annotated[int, Field(description="Every Nth row, ending at the last.")] = 1,
        last: Annotated[int | None, Field(description="The last N rows (after every).")] = None,
    ) -> models.HistoryResult:
        return await _off_loop(
            lambda: observe.history(
                gate.root, gate._existing_dir(run_dir), run, columns, every, last
            )
        )

    @_tool(server, "A PNG of runs' curves (a panel per metric, a line per run). Needs "
                 "pip install 'nitro[plot]'.")  # fmt: skip
    async def nitro_plot(
        run_dir: Annotated[str, Field(description="A run directory.")],
        runs: Annotated[
            list[str] | None,
            Field(description="Up to 8 run ids; default the latest."),
        ] = None,
        metrics: Annotated[
            list[str] | None,
            Field(description="e.g. ['val.acc']; default loss and val metrics."),
        ] = None,
    ) -> list[Image | TextContent]:
        png, caption = await _off_loop(
            lambda: observe.plot(gate.root, gate._existing_dir(run_dir), runs, metrics)
        )
        return [Image(data=png, format="png"), TextContent(type="text", text=caption)]

    return server
