"""The observing family: ``nitro_history``, ``nitro_plot`` and ``nitro_compare``.

What runs did, read from their metrics logs and manifests: a run's rows per epoch
(bounded, thinned on request), a PNG of runs' curves, and several runs side by side with
the config fields that differ. The readers live in :mod:`nitro_mcp.observe` and
:mod:`nitro_mcp.catalog`; this module declares the tools over them.
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import Image
from mcp.types import TextContent
from pydantic import Field

from nitro_core.errors import ConfigError, render
from nitro_mcp import catalog, group_compare, models, observe
from nitro_mcp.echo import clip
from nitro_mcp.gate import Gate
from nitro_mcp.refusals import ToolRenderer
from nitro_mcp.replies import NitroServer
from nitro_mcp.tools.declare import off_loop, tool


def register(server: NitroServer, gate: Gate) -> None:
    @tool(server, "A run's logged metrics per epoch (train_loss, lr, val.<metric>, ...).")
    async def nitro_history(
        run_dir: Annotated[str, Field(description="A run directory.")],
        run: Annotated[str | None, Field(description="Default the run that logged last.")] = None,
        columns: Annotated[
            list[str] | None, Field(description="e.g. ['epoch', 'val.loss']; default all.")
        ] = None,
        every: Annotated[int, Field(description="Every Nth row, ending at the last.")] = 1,
        last: Annotated[int | None, Field(description="The last N rows (after every).")] = None,
    ) -> models.HistoryResult:
        return await off_loop(
            lambda: observe.history(
                gate.root, gate.existing_dir(run_dir), run, columns, every, last
            )
        )

    @tool(server, "A PNG of runs' curves (a panel per metric). Needs "
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
        png, caption = await off_loop(
            lambda: observe.plot(gate.root, gate.existing_dir(run_dir), runs, metrics)
        )
        text = render(caption, ToolRenderer("nitro_plot"))
        return [Image(data=png, format="png"), TextContent(type="text", text=text)]

    @tool(server, "Compare 2 to 8 runs (config diff, metrics, parent), or a seed group's "
          "mean/std against a baseline.")  # fmt: skip
    async def nitro_compare(
        sources: Annotated[
            list[str] | None,
            Field(description="'runs/a' (latest run), 'runs/a:<run id>', 'runs/a:all'."),
        ] = None,
        group: Annotated[str | None, Field(description="A group id from nitro_train(seeds=).")] = None,
        baseline: Annotated[str | None, Field(description="With group: a group id or sources item.")] = None,
    ) -> models.CompareResult:  # fmt: skip
        if group is None:
            if baseline is not None:
                raise ConfigError(
                    f"baseline={clip(baseline)} is what a group is compared against; send "
                    f"group= with it, {group_compare.EXAMPLE}."
                )
            if sources is None:
                raise ConfigError(
                    "nitro_compare needs sources=[...] (2 to 8 runs, e.g. sources=['runs/a', "
                    f"'runs/b']) or group= (a seed group), {group_compare.EXAMPLE}."
                )
            return await off_loop(catalog.compare, gate.root, sources)
        if sources is not None:
            raise ConfigError(
                f"sources and group={clip(group)} both name what to compare; send group= (with "
                "baseline= for what it is measured against) or sources=, not both."
            )
        return await off_loop(group_compare.compare, gate, group, baseline)
