"""The lifecycle family: ``nitro_delete`` and ``nitro_export``.

What leaves a run directory: records deleted (a dry run unless asked, refused while a job
uses the run; :mod:`nitro_mcp.delete_call`), and weights written out as a new safetensors file
or a Hugging Face model directory (:mod:`nitro_mcp.catalog`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool

from nitro_core.errors import ConfigError
from nitro_mcp import catalog, delete_call, models
from nitro_mcp.echo import clip
from nitro_mcp.gate import Gate
from nitro_mcp.replies import NitroServer
from nitro_mcp.tools.declare import off_loop, tool


def register(server: NitroServer, gate: Gate) -> None:
    @tool(server, "Delete a run or some records: a dry run unless dry_run=false; refused while a "
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
        return await off_loop(
            delete_call.delete, gate.root, gate.jobs, run_dir, gate.where(run_dir), run, files,
            dry_run,
        )  # fmt: skip

    @tool(server, "Write a checkpoint's weights to a new .safetensors file, or (format='hf') "
          "an HF directory.")  # fmt: skip
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
        return await off_loop(export, gate, source, path, run_dir, format, dtype, max_shard_size)


def export(
    gate: Gate, source: str, path: str, run_dir: str | None, format: str = "weights",
    dtype: str | None = None, max_shard_size: str = "5GB",
) -> models.ExportResult:  # fmt: skip
    if format != "hf" and (dtype is not None or max_shard_size != "5GB"):
        raise ConfigError(
            "dtype and max_shard_size are options of format='hf'; write "
            f"nitro_export(source={clip(source)}, path={clip(path)}, format='hf', ...) or "
            "drop them."
        )
    options = catalog.HFOptions(dtype, max_shard_size, gate.registry) if format == "hf" else None
    url = gate.storage_url(run_dir)  # a run directory on object storage, under --storage
    record = gate.storage_url(source, "source")  # a record's URL: under --storage too
    url = url or (record.parent if record is not None else None)
    return catalog.export(gate.root, source, path, run_dir, options, url)
