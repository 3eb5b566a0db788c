"""``llmattr evaluate``: datasets x methods x metrics into a resumable SQLite store (docs/evaluate.md)."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from ..checks import (
    examples_wanted,
)
from ..errors import LlmattrError
from ..model_free import (
    check_shards,
)
from .app import DERIVED, app, plugin_command


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


@app.command(cls=plugin_command(metric_options, registered_help))
def evaluate(
    ctx: typer.Context,
    model: str = typer.Option(None, help="'default' (SmolLM2-135M-Instruct), 'gemma-3-270m', a hub id, "
                                                 "a folder or a .gguf."),
    datasets: str = typer.Option(None, help="Comma-separated datasets, e.g. sst2,imdb,boolq, or blimp (its five "
                                            "paradigms); default sst2."),
    methods: str = typer.Option(None, help="Comma-separated methods; parameters as name:key=value "
                                           "(e.g. grad-ellm:attention=softmax). Default grad-ellm."),
    metrics: str = typer.Option(None, help="Comma-separated metrics, e.g. pi-soft,soft,deletion-insertion "
                                           "(default pi-soft)."),
    routing: str = typer.Option(None, help="Soft-metric protocol: dynamic (default), fixed or both."),
    n: str = typer.Option(None, "--n", "-n", "--examples", help="Examples per dataset, or all (every row). Default: "
                          "50 of a shipped dataset, balanced per class; every row of --data. Under torchrun write -n "
                          "or --examples (torchrun takes --n for its own --nnodes)."),
    seed: int = typer.Option(None, help="Seed of example sampling, attributions and perturbations "
                                        "(default 0)."),
    layers: str = typer.Option(None, help="Sweep of the parameter a method names as its layer sweep (Grad-ELLM: "
                                          "the number of aggregated layers), e.g. 1,4,8,16,all."),
    max_new_tokens: int = typer.Option(None, help="Tokens to generate and explain (task default if unset)."),
    scope: str = typer.Option(None, help="What is attributed, perturbed and zeroed: span (default), prompt "
                                         "(every prompt token: paper 000's pipeline) or all (+ generated prefix)."),
    target: str = typer.Option(None, help="Tasks with label words: explain the predicted label word (label, "
                                          "default), the free greedy answer (generated) or the gold label (gold)."),
    out: Path = typer.Option(None, help="Results store (default results.sqlite; shard i writes "
                                        "results.rank{i}.sqlite)."),
    config: Path = typer.Option(None, help="TOML file with the same keys; command-line options "
                                             "override it."),
    shard: str = typer.Option(None, help="Take shard i of n of every dataset, as i/n (default: "
                                         "RANK/WORLD_SIZE of torchrun/accelerate, else the Slurm task's, else 0/1)."),
    device: str = typer.Option(None, help="cpu, cuda, cuda:N or auto (default auto; when sharded, the GPU of "
                                          "LOCAL_RANK, else of SLURM_LOCALID)."),
    dtype: str = typer.Option(None, help="float32, bfloat16, float16 or auto."),
    device_map: str = typer.Option(None, help="'auto' spreads a big model over the GPUs (accelerate)."),
    max_memory: str = typer.Option(None, help="Memory per device for --device-map, e.g. cpu=2GB,0=20GB (the rest "
                                              "is offloaded to disk)."),
    load_in_4bit: bool = typer.Option(None, "--load-in-4bit/--no-load-in-4bit", help="4-bit weights "
                                                                                       "(bitsandbytes)."),
    data: Path = typer.Option(None, help="Your own JSONL/CSV/TSV file instead of --datasets (named by its stem)."),
    task: str = typer.Option(None, help="--data: the task that prompts its rows (default sentiment)."),
    text_field: str = typer.Option(None, help="--data: the column holding the text (default: the task's field)."),
    label_field: str = typer.Option(None, help="--data: the column holding the label (default: label)."),
    labels: str = typer.Option(None, help="--data: label words, e.g. Positive,Negative, or file value=word pairs, "
                                          "e.g. 0=Negative,1=Positive (default: the task's)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    launcher: str = typer.Option("none", rich_help_panel="Launcher", help="Run --shards shards as one job array "
                                 "through submitit: slurm, or local (processes on this machine); none runs here."),
    shards: int = typer.Option(None, rich_help_panel="Launcher", help="--launcher: how many shards (jobs)."),
    partition: str = typer.Option(None, rich_help_panel="Launcher", help="--launcher slurm: the partition."),
    gpus: int = typer.Option(None, rich_help_panel="Launcher", help="--launcher slurm: GPUs per shard (default 0)."),
    time: int = typer.Option(None, rich_help_panel="Launcher", help="--launcher: minutes per job before it is "
                             "requeued (default 60); a preempted or timed-out shard resumes from its store."),
    mem: int = typer.Option(None, rich_help_panel="Launcher", help="--launcher slurm: memory per shard in GB."),
    account: str = typer.Option(None, rich_help_panel="Launcher", help="--launcher slurm: the account charged."),
    wait: bool = typer.Option(None, "--wait/--no-wait", rich_help_panel="Launcher", help="--launcher: wait for "
                              "every shard (default for local) or return once submitted (default for slurm)."),
    submitit_folder: Path = typer.Option(None, rich_help_panel="Launcher", help="--launcher: folder of the jobs' "
                                         "logs (default: submitit/ next to --out)."),
) -> None:
    """Evaluate attribution methods on datasets; every finished example is stored at once, reruns resume. Exits 1
    when a unit failed (every good one is stored; the same command again retries the failed ones)."""
    examples_wanted(n)  # a bad --n is refused before the config file is read; EvalConfig checks it again
    cli = {"model": model, "datasets": datasets, "methods": methods, "metrics": metrics, "routing": routing,
           "n": n, "seed": seed, "layers": layers, "max_new_tokens": max_new_tokens, "target": target,
           "scope": scope, "out": None if out is None else str(out), "shard": shard,
           "device": device, "dtype": dtype, "device_map": device_map, "max_memory": max_memory,
           "load_in_4bit": load_in_4bit, "data": None if data is None else str(data), "task": task,
           "text_field": text_field, "label_field": label_field, "labels": labels, **ctx.meta.get(DERIVED, {})}
    launch = {"shards": shards, "partition": partition, "gpus": gpus, "time": time, "mem": mem, "account": account,
              "wait": wait, "submitit_folder": submitit_folder}
    launched = launcher != "none" or any(value is not None for value in launch.values())
    if launched:
        launch_checks(launcher, **launch)
    from ..evaluation import EvalConfig, plan, run  # the library's, importing no torch (llmattr.lazy)

    cfg = EvalConfig.from_mapping(cli, EvalConfig.from_toml(config) if config is not None else None)
    planned = plan(cfg)  # every check that needs no model, the library's own, in its order: no torch yet
    if launched:  # what launch_shards refuses before it submits
        check_shards(shards, cfg.shard)
    console = Console(stderr=True)
    if launched:
        launch_shards(cfg, launcher, console, **launch)
        return
    try:
        summary = run(cfg, progress=not quiet, planned=planned)
    except KeyboardInterrupt:
        console.print(f"interrupted: every finished example is stored in {cfg.out}; rerun the same command "
                      "to resume", highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    for name, count in summary.excluded.items():
        if count:
            console.print(f"{name}: left out {count} rows that {cfg.model} was trained on (its model card)",
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
