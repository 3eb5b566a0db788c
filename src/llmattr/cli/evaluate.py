"""``llmattr evaluate``: datasets x methods x metrics into a resumable SQLite store (docs/evaluate.md)."""

from __future__ import annotations

import importlib.util
import inspect
from dataclasses import fields
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from ..checks import (
    examples_wanted,
)
from ..errors import LlmattrError
from ..evaluation import EvalConfig, plan, run  # the library's, importing no torch (llmattr.lazy)
from ..evaluation.sharding import check_shards
from .app import DERIVED, app, command, field_option, own, plugin_command


def registered_help() -> dict[str, str]:
    """``--datasets``' and ``--metrics``' help, naming every registered task with a sample file, every group of them
    with its datasets (``Task.group``) and every metric."""
    from ..evaluation.run_datasets import dataset_groups, dataset_names  # the registries, importing no torch
    from ..faithfulness import METRICS

    groups = [f"{group} ({', '.join(names)})" for group, names in dataset_groups().items()]
    return {"datasets": f"Comma-separated datasets (default sst2): {', '.join([*dataset_names(), *groups])}.",
            "metrics": f"Comma-separated metrics (default pi-soft): {', '.join(sorted(METRICS))}."}


def metric_options() -> list[inspect.Parameter]:
    """An option ``--NAME`` per option a registered metric declares (``Metric.declares``: the built-in metrics'
    samples, step_stride, coupling and removal, and any plugin's), typed by its default."""
    from ..faithfulness import declared_options

    return [inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY,
        annotation=type(option.default) if isinstance(option.default, int | float | str) else str,
        default=typer.Option(None, option.flag, rich_help_panel="Metric options",
                             help=f"{option.help} (default {str(option.default) or 'none'}"
                                  + (f"; one of {', '.join(map(str, option.valid))})" if option.valid else ")")))
        for name, option in sorted(declared_options().items())]


CONFIG = {f.name: f for f in fields(EvalConfig) if "help" in f.metadata}  # the library's settings, written once
LAUNCH = ("shards", "partition", "gpus", "time", "mem", "account", "wait", "submitit_folder")
PANEL = "Launcher"
OPTIONS = [  # in the order of the help; every setting unset (None) so that a --config file's value stands
    *(field_option(CONFIG[name], None) for name in ("model", "datasets", "methods", "metrics", "routing", "n",
                                                     "seed", "layers", "max_new_tokens", "scope", "target", "out")),
    own("config", Path, None, "TOML file with the same keys; command-line options override it."),
    *(field_option(CONFIG[name], None) for name in ("shard", "device", "dtype", "device_map", "max_memory",
                                                     "load_in_4bit", "data", "task", "text_field", "label_field",
                                                     "labels")),
    own("quiet", bool, False, "No progress bar.", "--quiet"),
    own("launcher", str, "none", "Run --shards shards as one job array through submitit: slurm, or local (processes "
                                 "on this machine); none runs here.", panel=PANEL),
    own("shards", int, None, "--launcher: how many shards (jobs).", panel=PANEL),
    own("partition", str, None, "--launcher slurm: the partition.", panel=PANEL),
    own("gpus", int, None, "--launcher slurm: GPUs per shard (default 0).", panel=PANEL),
    own("time", int, None, "--launcher: minutes per job before it is requeued (default 60); a preempted or timed-out "
                           "shard resumes from its store.", panel=PANEL),
    own("mem", int, None, "--launcher slurm: memory per shard in GB.", panel=PANEL),
    own("account", str, None, "--launcher slurm: the account charged.", panel=PANEL),
    own("wait", bool, None, "--launcher: wait for every shard (default for local) or return once submitted (default "
                            "for slurm).", "--wait/--no-wait", panel=PANEL),
    own("submitit_folder", Path, None, "--launcher: folder of the jobs' logs (default: submitit/ next to --out).",
        panel=PANEL),
]


@app.command(cls=plugin_command(metric_options, registered_help))
@command(OPTIONS)
def evaluate(ctx: typer.Context, **given) -> None:
    """Evaluate attribution methods on datasets; every finished example is stored at once, reruns resume. Exits 1
    when a unit failed (every good one is stored; the same command again retries the failed ones)."""
    examples_wanted(given["n"])  # a bad --n is refused before the config file is read; EvalConfig checks it again
    cli = {**{name: str(given[name]) if isinstance(given[name], Path) else given[name] for name in CONFIG},
           **ctx.meta.get(DERIVED, {})}
    launch = {name: given[name] for name in LAUNCH}
    launched = given["launcher"] != "none" or any(value is not None for value in launch.values())
    if launched:
        launch_checks(given["launcher"], **launch)
    config = given["config"]
    cfg = EvalConfig.from_mapping(cli, EvalConfig.from_toml(config) if config is not None else None)
    planned = plan(cfg)  # every check that needs no model, the library's own, in its order: no torch yet
    if launched:  # what launch_shards refuses before it submits
        check_shards(given["shards"], cfg.shard)
    console = Console(stderr=True)
    if launched:
        launch_shards(cfg, given["launcher"], console, **launch)
        return
    try:
        summary = run(cfg, progress=not given["quiet"], planned=planned)
    except KeyboardInterrupt:
        console.print(f"interrupted: every finished example is stored in {cfg.out}; rerun the same command "
                      "to resume", highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    print_summary(summary, cfg.model, console)


def print_summary(summary, model: str, console: Console) -> None:
    """What the run did, on stderr: rows left out (a finetune's training rows), the counts, each failed unit; exit
    status 1 when a unit failed."""
    for name, count in summary.excluded.items():
        if count:
            console.print(f"{name}: left out {count} rows that {model} was trained on (its model card)",
                          highlight=False, soft_wrap=True)
    console.print(f"{summary.computed} computed, {summary.skipped} already in the store, "
                  f"{len(summary.failed)} failed, {summary.seconds:.1f} s -> {summary.out}")
    for line in summary.failed:
        console.print(f"[yellow]skipped[/] {escape(line)}", highlight=False, soft_wrap=True)
    if summary.failed:  # every good unit is stored; a script sees from the exit code that some are missing
        console.print(f"{len(summary.failed)} unit(s) failed; every other one is in {summary.out}: fix the cause "
                      "and run the same command again to retry only the failed ones", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


def launch_checks(launcher: str, *, shards: int | None, partition: str | None, gpus: int | None, time: int | None,
                  mem: int | None, account: str | None, wait: bool | None, submitit_folder: Path | None) -> None:
    """The options of ``--launcher local|slurm`` (those of :func:`launch_shards`), checked before torch loads."""
    if launcher == "none":
        raise LlmattrError("--shards, --partition, --gpus, --time, --mem, --account, --wait and --submitit-folder "
                           "need --launcher local or slurm")
    if launcher not in ("local", "slurm"):
        raise LlmattrError(f"unknown launcher {launcher!r}; valid: none, local, slurm")
    if shards is None:
        raise LlmattrError(f"--launcher {launcher} needs --shards n (how many jobs)")
    slurm_only = {"--partition": partition, "--gpus": gpus, "--mem": mem, "--account": account}
    if launcher == "local" and any(value is not None for value in slurm_only.values()):
        named = ", ".join(flag for flag, value in slurm_only.items() if value is not None)
        raise LlmattrError(f"{named}: Slurm options; --launcher local runs processes on this machine")
    for flag, value in (("--gpus", gpus), ("--mem", mem)):
        if value is not None and value < 0:
            raise LlmattrError(f"{flag} must be 0 or more, got {value}")
    if time is not None and time < 1:
        raise LlmattrError(f"--time must be at least 1 minute, got {time}")
    if importlib.util.find_spec("submitit") is None:
        raise LlmattrError(f"--launcher {launcher} submits through submitit: pip install 'llmattr[slurm]'")


def launch_shards(cfg, launcher: str, console: Console, *, shards: int | None, partition: str | None,
                  gpus: int | None, time: int | None, mem: int | None, account: str | None, wait: bool | None,
                  submitit_folder: Path | None) -> None:
    """``--launcher local|slurm``: the shards submitted as one job array (every option checked before, by
    :func:`launch_checks`); waits (and exits 1 when a shard failed) or prints the job ids; either way prints the
    status and report commands."""
    from ..evaluation.launch import Resources, shard_configs, store_pattern, submit

    shard_configs(cfg, shards)  # refuses --shard and --shards < 1 before anything is written
    cfg.validate()
    folder = submitit_folder or Path(cfg.out).parent / "submitit"
    resources = Resources(partition=partition, gpus=gpus or 0, minutes=time or 60, mem_gb=mem, account=account)
    jobs = submit(cfg, shards, launcher, folder, resources)
    console.print(f"{launcher}: submitted {shards} shard(s) as jobs {', '.join(job.job_id for job in jobs)}; logs "
                  f"in {folder}", highlight=False, soft_wrap=True)
    failed = 0
    if wait if wait is not None else launcher == "local":
        for i, job in enumerate(jobs):
            try:
                summary = job.result()
            except Exception as err:  # noqa: BLE001 - a job's failure is reported per shard, the others still count
                console.print(f"shard {i}/{shards} failed: {str(err).strip().splitlines()[-1]}", highlight=False,
                              soft_wrap=True)
                failed += 1
                continue
            console.print(f"shard {i}/{shards}: {summary.computed} computed, {summary.skipped} already in the store,"
                          f" {len(summary.failed)} failed -> {summary.out}", highlight=False, soft_wrap=True)
            failed += bool(summary.failed)
    else:
        console.print(f"progress: llmattr status '{store_pattern(cfg, shards)}'", highlight=False, soft_wrap=True)
    console.print(f"report: llmattr report '{store_pattern(cfg, shards)}'", highlight=False, soft_wrap=True)
    if failed:
        console.print(f"{failed} shard(s) did not finish every unit; the same command again resumes them",
                      highlight=False, soft_wrap=True)
        raise typer.Exit(1)
