"""The `agentrl` command: a thin dispatcher. Each command imports what it needs when it runs, so --help is instant."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

app = typer.Typer(help="Train LLM agents with RL on multi-turn text environments.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
envs_app = typer.Typer(help="Inspect registered environments.", no_args_is_help=True)
app.add_typer(envs_app, name="envs")
env_app = typer.Typer(help="Serve an environment to other processes and machines.", no_args_is_help=True)
app.add_typer(env_app, name="env")
webshop_app = typer.Typer(help="WebShop tools.", no_args_is_help=True)
app.add_typer(webshop_app, name="webshop")


_ENV_HELP = ("Env id (see `agentrl envs list`), or package.module:Class (imported from --app-dir, default the "
             "current folder), or path/to/file.py:Class.")

# Exit codes, as shells and CI read them: 2 when the command line (or its config) is wrong and nothing was tried, as
# click's own usage errors; 1 when the work itself failed (training, the cluster, a server); 128 + N for signal N
# (130 Ctrl-C, 143 SIGTERM).
USAGE_ERROR, FAILURE = 2, 1


def _fail(message: str, code: int = USAGE_ERROR) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _exit_code(error: BaseException) -> int:
    """1 for a package the install left out (the command line was right, the install was not), else 2."""
    from agentrl.extras import MissingExtraError
    from agentrl.registry import EnvExtraError

    return FAILURE if isinstance(error, (EnvExtraError, MissingExtraError)) else USAGE_ERROR


def _version(value: bool) -> None:
    if value:
        from agentrl import __version__

        typer.echo(f"agentrl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print agentrl's version and exit."),
    log_level: str = typer.Option("warning", "--log-level", envvar="AGENTRL_LOG_LEVEL", show_envvar=True,
                                  metavar="LEVEL", help="debug, info, warning, error or critical: agentrl's log lines "
                                                        "at this level and above go to stderr (debug also lets Ray's "
                                                        "and vLLM's start-up lines through)."),
    app_dir: Path = typer.Option(Path("."), "--app-dir", metavar="FOLDER",
                                 help="Put FOLDER first on the import path before resolving package.module:attr "
                                      "names (--env pkg.mod:Class, --agent pkg.mod:function), as uvicorn does: a "
                                      "console script does not import from the current folder by itself."),
) -> None:
    """Train LLM agents with RL on multi-turn text environments."""
    from agentrl.logs import configure_logging
    from agentrl.registry import use_app_dir

    try:
        configure_logging(log_level)
        use_app_dir(app_dir)
    except ValueError as e:
        _fail(str(e))


@app.command("doctor")
def doctor_(
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    model: str | None = typer.Option(None, "--model", help="Model the engine choice is made for (default: the run "
                                                           "config's default model)."),
) -> None:
    """Report what this machine offers: versions, CPU features (native bf16), cores, memory, GPUs, tools, engine."""
    import json

    from agentrl.cli.doctor import collect, render

    report = collect(model)
    typer.echo(json.dumps(report, indent=2) if as_json else render(report))


@envs_app.command("list")
def envs_list() -> None:
    """List registered envs: id, one-line description, providing package."""
    import agentrl

    rows = []
    for env_id, spec in agentrl.registered().items():
        try:
            description = spec.description
        except Exception as e:  # a broken third-party env must not hide the others
            description = f"(cannot load: {e})"
        rows.append((env_id, description, spec.package))
    width = max(len(r[0]) for r in rows) if rows else 2
    pkg_width = max(len(r[2]) for r in rows) if rows else 7
    typer.echo(f"{'id':<{width}}  {'package':<{pkg_width}}  description")
    for env_id, description, package in rows:
        typer.echo(f"{env_id:<{width}}  {package:<{pkg_width}}  {description}")


def _parse_kwargs(pairs: list[str]) -> dict:
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            _fail(f"--env-arg expects KEY=VALUE, got {pair!r}")
        try:  # VALUE is YAML so numbers, booleans and lists arrive typed: level=2, task_types=[a, b]
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            _fail(f"--env-arg {pair!r}: the value is not valid YAML ({str(e).splitlines()[0]}); quote it or fix it")
    return out


@app.command()
def play(
    env: str = typer.Option(..., "--env", help=_ENV_HELP),
    seed: int = typer.Option(0, help="Episode seed: the same seed replays the same task."),
    expert: bool = typer.Option(False, "--expert", help="Let the env's expert play and print the transcript."),
    env_arg: list[str] = typer.Option([], "--env-arg", help="Env constructor argument KEY=VALUE (repeatable)."),
    max_steps: int = typer.Option(200, help="Stop after this many actions."),
) -> None:
    """Play one episode in the terminal (you type actions), or watch the expert play it."""
    import agentrl
    from agentrl.recipes.play import play_episode

    if seed < 0:
        _fail(f"--seed must be >= 0 (env seeds cannot be negative), got {seed}")
    if max_steps < 1:
        _fail(f"--max-steps must be >= 1, got {max_steps}")
    try:
        instance = agentrl.make(env, **_parse_kwargs(env_arg))
    except agentrl.UnknownEnvError as e:
        _fail(str(e), _exit_code(e))
    except (TypeError, ValueError, OSError) as e:  # the env's own message names the bad argument
        _fail(f"bad env argument for {env!r}: {e}")
    result = play_episode(instance, seed=seed, expert=expert, max_steps=max_steps)
    raise typer.Exit(0 if result.ended else 1)


# Typer hands every argument to a click command built from the config dataclasses (`agentrl.cli.flags`): one flag per
# config field, generated, with --help in sections. Typer itself cannot take a generated set of options.
@app.command(add_help_option=False, context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                                      "allow_interspersed_args": False})
def run(ctx: typer.Context) -> None:
    """Train a model with RL on an env: rollouts, the loss, AdamW, metrics.jsonl, curves.png, checkpoints."""
    from agentrl.cli.flags import run_command

    help_text = f"{run.__doc__}\n\nEvery config field is a flag: --section.field-name (YAML for lists and mappings)."
    _main(run_command(_run, _run_options(), help=help_text), ctx)


def _run_options() -> list:
    """`agentrl run`'s own options; every other flag is a config field."""
    import click

    path = click.Path(path_type=Path)
    return [
        click.Option(["--config"], type=path, help="YAML config (see configs/); flags override it."),
        click.Option(["--resume"], type=path, help="Continue the run saved in this folder."),
        click.Option(["--env-arg"], multiple=True, metavar="KEY=VALUE",
                     help="Env constructor argument (repeatable), merged into env.kwargs."),
        click.Option(["--overwrite"], is_flag=True, help="Replace a run already saved in --output."),
    ]


def _run(overrides: dict, config: Path | None, resume: Path | None, env_arg: tuple[str, ...], overwrite: bool) -> None:
    """`agentrl run`'s body: `overrides` are the config flags given (dotted path -> value)."""
    from agentrl.config import ConfigError, load_config, read_run_config
    from agentrl.extras import MissingExtraError
    from agentrl.models import UnknownModelError
    from agentrl.registry import UnknownEnvError

    try:
        if resume is not None:
            saved = resume / "config.yaml"
            if not saved.is_file():
                _fail(f"cannot resume {resume}: no config.yaml there (is it an agentrl run folder?)")
            cfg, moved = read_run_config(saved)
            if moved:
                typer.echo(f"{saved} uses the earlier config layout; read with {len(moved)} keys moved "
                           f"({moved[0]}, ...)", err=True)
            overrides["output"] = str(resume)
        else:
            cfg = load_config(config)
        cfg = _configured(cfg, overrides, env_arg)
        if cfg.agent.function:  # a wrong --agent is answered before the trainer's imports (seconds)
            from agentrl.serve.loader import load_agent

            load_agent(cfg.agent.function)
    except (ConfigError, UnknownModelError, UnknownEnvError) as e:
        _fail(str(e), _exit_code(e))
    import dataclasses

    from agentrl.recipes.stops import exit_code
    from agentrl.recipes.train import TrainingError, default_run_dir, plot_curves, train

    if not cfg.output:  # named here, so an interrupted run can still say where it is
        cfg = dataclasses.replace(cfg, output=str(default_run_dir(cfg)))
    code = 0
    try:
        out = train(cfg, resume=resume is not None, overwrite=overwrite)
    except (ConfigError, UnknownModelError, UnknownEnvError, MissingExtraError) as e:
        _fail(str(e), _exit_code(e))
    except TrainingError as e:  # the run started and failed (or refused a setting only the loaded model shows)
        _fail(str(e), FAILURE)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (`RunStopped`)
        code = exit_code(e)
    if code:  # said outside the except: the stopped frames (and their progress bars) are gone, so this is the end
        _stopped(Path(cfg.output), cfg.steps, code, plot_curves)
    typer.echo(f"run saved in {out} (metrics.jsonl, curves.png, checkpoint/)")


def _stopped(out: Path, steps: int, code: int, plot_curves) -> None:
    """A run stopped by a signal: plot what it has, then one line on where it stands and how to go on."""
    import signal

    from agentrl.recipes.train import stop_message

    if (out / "metrics.jsonl").exists():
        plot_curves(out / "metrics.jsonl", out / "curves.png")
    name = "Ctrl-C" if code == 128 + signal.SIGINT else signal.Signals(code - 128).name
    # Not "error:": the user asked for this stop
    typer.secho(stop_message(out, steps, name), fg=typer.colors.YELLOW, err=True)
    raise typer.Exit(code)


@app.command(add_help_option=False, context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                                      "allow_interspersed_args": False})
def sft(ctx: typer.Context) -> None:
    """Supervised warm start on expert (or given) episodes, with RL's templates and loss masks; checkpoint + eval."""
    from agentrl.cli.flags import sft_command

    help_text = f"{sft.__doc__}\n\nEvery config field is a flag: --section.field-name (YAML for lists and mappings)."
    _main(sft_command(_sft, _sft_options(), help=help_text), ctx)


def _main(command, ctx: typer.Context) -> None:
    """Run a generated click command on the arguments typer passed through; usage errors end in one line."""
    import click

    try:
        command.main(ctx.args, prog_name=ctx.command_path, standalone_mode=False)
    except click.UsageError as e:  # a bad flag or value: one line, as every other error here
        _fail(e.format_message())
    except click.Abort:
        _fail("interrupted", code=130)


def _sft_options() -> list:
    """`agentrl sft`'s own options; every other flag is a field of `SFTConfig`."""
    import click

    return [
        click.Option(["--config"], type=click.Path(path_type=Path),
                     help="YAML SFT config (see configs/*-sft.yaml); flags override it."),
        click.Option(["--env-arg"], multiple=True, metavar="KEY=VALUE",
                     help="Env constructor argument (repeatable), merged into env.kwargs."),
        click.Option(["--overwrite"], is_flag=True, help="Replace a run already saved in --output."),
    ]


def _sft(overrides: dict, config: Path | None, env_arg: tuple[str, ...], overwrite: bool) -> None:
    """`agentrl sft`'s body: `overrides` are the config flags given (dotted path -> value)."""
    from agentrl.cluster import ClusterError
    from agentrl.config import ConfigError
    from agentrl.models import UnknownModelError
    from agentrl.recipes.sft import SFTError, load_sft_config, run_sft
    from agentrl.registry import UnknownEnvError
    from agentrl.training.backend import TrainerFailure

    try:
        cfg = _configured(load_sft_config(config), overrides, env_arg)
        out = run_sft(cfg, overwrite=overwrite)
    except (ConfigError, SFTError, UnknownModelError, UnknownEnvError) as e:
        _fail(str(e), _exit_code(e))
    except (ClusterError, TrainerFailure) as e:
        _fail(str(e), FAILURE)
    except KeyboardInterrupt:
        _fail("interrupted; nothing was checkpointed", code=130)
    summary = (out / "summary.json").read_text()
    typer.echo(summary)
    typer.echo(f"SFT run saved in {out} (metrics.jsonl, curves.png, checkpoint/, eval/); continue with RL: "
               f"agentrl run --env {cfg.env.id} --model {out / 'checkpoint'}")


def _configured(cfg, overrides: dict, env_arg: tuple[str, ...]):
    """`cfg` (a `RunConfig` or `SFTConfig`) with the command line's flags and --env-arg applied, env and model checked.

    Typos in the env or model name must not wait for the trainer's imports (seconds).
    """
    from agentrl.config import apply_overrides
    from agentrl.models import check_model_name
    from agentrl.registry import spec

    _merge_env_args(overrides, cfg, env_arg)
    cfg = apply_overrides(cfg, overrides)
    spec(cfg.env.id)
    check_model_name(cfg.model)
    return cfg


def _merge_env_args(overrides: dict, cfg, env_arg: tuple[str, ...]) -> None:
    """--env-arg KEY=VALUE merges into env.kwargs; a new --env starts from no kwargs (the old ones were its env's)."""
    from agentrl.config import ConfigError

    env = overrides.get("env.id")
    if env_arg:
        base = overrides.get("env.kwargs", cfg.env.kwargs if env is None else {})
        if not isinstance(base, dict):
            raise ConfigError(f"env.kwargs: expected a mapping, got {base!r}")
        overrides["env.kwargs"] = {**base, **_parse_kwargs(list(env_arg))}
    elif env is not None and env != cfg.env.id and "env.kwargs" not in overrides:
        overrides["env.kwargs"] = {}  # the default kwargs belong to the default env
    if env is not None and env != cfg.env.url and "env.url" not in overrides:
        overrides["env.url"] = ""  # --env names another env than the config's served one


@app.command("eval")
def eval_(
    ctx: typer.Context,
    env: str | None = typer.Option(None, "--env", help=_ENV_HELP),
    model: str | None = typer.Option(None, "--model", help="Built-in model, run checkpoint folder or hub id."),
    split: str | None = typer.Option(None, "--split", help="Held-out split (default: test, where the env has one)."),
    episodes: int = typer.Option(32, "--episodes", help="Tasks (env seeds) to evaluate."),
    k: str = typer.Option("1", "--k", help="pass@k to report, comma-separated, e.g. 1,4,8."),
    samples_per_task: int | None = typer.Option(None, "--samples-per-task", help="n per task (default: max k)."),
    output: Path = typer.Option(Path("runs/eval"), "--output", help="Folder for results.json and report.html."),
    env_arg: list[str] = typer.Option([], "--env-arg", help="Env constructor argument KEY=VALUE (repeatable)."),
    max_turns: int = typer.Option(20, "--max-turns", help="Model calls per episode."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", help="Per turn."),
    temperature: float | None = typer.Option(None, "--temperature", help="Override the model's official value."),
    top_p: float | None = typer.Option(None, "--top-p", help="Override the model's official value."),
    top_k: int | None = typer.Option(None, "--top-k", help="Override the model's official value."),
    min_p: float | None = typer.Option(None, "--min-p", help="Override the model's official value."),
    repetition_penalty: float | None = typer.Option(None, "--repetition-penalty", help="Override (1 = off)."),
    presence_penalty: float | None = typer.Option(None, "--presence-penalty", help="Override (0 = off)."),
    thinking: bool | None = typer.Option(None, "--thinking/--no-thinking", help="Force the thinking mode."),
    seed: int = typer.Option(0, "--seed", help="Sampler seed."),
    seed_offset: int | None = typer.Option(None, "--seed-offset", help="First task seed (default: 1000000)."),
    runners: int = typer.Option(0, "--runners", help="Concurrent env runners in Ray actors (0 = in-process)."),
    ray_address: str | None = typer.Option(None, "--ray-address",
                                             help="Join this Ray cluster (default: RAY_ADDRESS's, else a local Ray)."),
    engine: str = typer.Option("auto", "--engine",
                                help="Inference engine: auto (vLLM where it serves the model), hf or vllm."),
    engine_dtype: str = typer.Option("", "--engine-dtype", help="Engine precision (default: the model's)."),
    engines: int = typer.Option(1, "--engines", help="Engine replicas (>1: Ray actors)."),
    compare: tuple[Path, Path] | None = typer.Option(None, "--compare", help="Compare two eval folders: A B."),
    log: list[str] = typer.Option([], "--log", help="Also log the results to these trackers (repeatable or "
                                                    "comma-separated): wandb, mlflow, tensorboard, trackio."),
    protocol: str | None = typer.Option(None, "--protocol", help="Named eval protocol (see --list-protocols): fixes "
                                        "env, split, task panel, steps, context, sampling, samples and intervals."),
    list_protocols: bool = typer.Option(False, "--list-protocols", help="List the named eval protocols and exit."),
) -> None:
    """Evaluate a model at its official sampling settings: success, reward, pass@k with intervals, report.html."""
    from agentrl.cluster import ClusterError
    from agentrl.config import ConfigError, EngineConfig, LogConfig, RunnersConfig
    from agentrl.models import UnknownModelError
    from agentrl.protocols import ProtocolError, listing
    from agentrl.recipes.evaluate import EVAL_SEED_OFFSET, EvalConfig, EvalError, eval_env, evaluate, load_results
    from agentrl.recipes.report import print_comparison, print_results
    from agentrl.registry import UnknownEnvError

    try:
        if compare is not None:
            a, b = (load_results(folder) for folder in compare)
            print_comparison(a, b, label_a=str(compare[0]), label_b=str(compare[1]))
            return
        if list_protocols:
            typer.echo(listing())
            return
        if protocol is not None:
            results = evaluate(_protocol_config(ctx, protocol, model, output, EngineConfig(
                kind=engine, dtype=engine_dtype, replicas=engines), RunnersConfig(count=runners), ray_address))
            print_results(results)
            typer.echo(f"results in {output / 'results.json'}, report in {output / 'report.html'}")
            return
        if env is None or model is None:
            _fail("agentrl eval needs --env and --model (or --compare DIR_A DIR_B)")
        if seed_offset is not None and seed_offset < 0:
            _fail(f"--seed-offset must be >= 0 (env seeds cannot be negative), got {seed_offset}")
        try:
            ks = tuple(sorted({int(part) for part in k.split(",") if part.strip()}))
        except ValueError:
            _fail(f"--k expects comma-separated integers like 1,4,8, got {k!r}")
        overrides = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p,
                     "repetition_penalty": repetition_penalty, "presence_penalty": presence_penalty}
        cfg = EvalConfig(
            model=model, split=split, episodes=episodes, ks=ks, samples_per_task=samples_per_task,
            env=eval_env(env, _parse_kwargs(env_arg), max_turns=max_turns,
                         seed_offset=EVAL_SEED_OFFSET if seed_offset is None else seed_offset),
            engine=EngineConfig(kind=engine, dtype=engine_dtype, replicas=engines),
            runners=RunnersConfig(count=runners), max_new_tokens=max_new_tokens, seed=seed, thinking=thinking,
            sampling_overrides={key: v for key, v in overrides.items() if v is not None}, output=str(output),
            ray_address=ray_address, log=LogConfig(trackers=tuple(log)),
        )
        results = evaluate(cfg)
    except (EvalError, ConfigError, UnknownModelError, UnknownEnvError, ProtocolError) as e:
        _fail(str(e), _exit_code(e))
    except ClusterError as e:
        _fail(str(e), FAILURE)
    except KeyboardInterrupt:
        _fail("interrupted; nothing was written", code=130)
    print_results(results)
    typer.echo(f"results in {output / 'results.json'}, report in {output / 'report.html'}")


# `agentrl eval` flags that change a protocol's settings -> the override they make (see `agentrl.protocols`).
_PROTOCOL_FLAGS = {"split": "split", "episodes": "episodes", "k": "ks", "samples_per_task": "samples_per_task",
                   "env_arg": "env_kwargs", "max_turns": "max_turns", "max_new_tokens": "max_new_tokens",
                   "seed": "seed", "seed_offset": "seed_offset", "thinking": "thinking", "temperature": "sampling",
                   "top_p": "sampling", "top_k": "sampling", "min_p": "sampling", "repetition_penalty": "sampling",
                   "presence_penalty": "sampling"}


def _protocol_config(ctx: typer.Context, name: str, model: str | None, output: Path, engine, runners, ray_address):
    """`agentrl eval --protocol NAME`: the protocol's `EvalConfig`.

    Flags that change its settings become overrides (the result is then labelled "NAME + overrides"); where it runs
    (engine, runners, output) is the caller's.
    """
    from agentrl.protocols import ProtocolRun, load_protocol
    from agentrl.recipes.evaluate import EvalError, from_protocol

    run = ProtocolRun(load_protocol(name))
    # By name: typer bundles its own click, whose ParameterSource is not click's.
    given = {p for p in ctx.params
             if getattr(ctx.get_parameter_source(p), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")}
    if "env" in given:
        raise EvalError(f"--env conflicts with --protocol {name}, which evaluates {run.protocol.env.id!r}; drop --env")
    if model is None:
        raise EvalError(f"agentrl eval --protocol {name} needs --model")
    overrides: dict = {}
    for flag in sorted(given & set(_PROTOCOL_FLAGS)):
        value = ctx.params[flag]
        if flag == "k":
            try:
                value = tuple(sorted({int(part) for part in value.split(",") if part.strip()}))
            except ValueError:
                raise EvalError(f"--k expects comma-separated integers like 1,4,8, got {value!r}") from None
        elif flag == "env_arg":
            value = _parse_kwargs(value)
        if _PROTOCOL_FLAGS[flag] == "sampling":
            overrides.setdefault("sampling", {})[flag] = value
        else:
            overrides[_PROTOCOL_FLAGS[flag]] = value
    return from_protocol(ProtocolRun(run.protocol, overrides), model, output=str(output), engine=engine,
                         runners=runners, ray_address=ray_address)


@app.command("inspect")
def inspect_(
    run_dir: Path = typer.Argument(..., help="A run folder (holds trajectories.jsonl, metrics.jsonl)."),
    plot: Path | None = typer.Option(None, "--plot", help="Also write a PNG of the distribution shifts here."),
    every: int = typer.Option(1, "--every", help="Show every N-th step (the last one is always shown)."),
) -> None:
    """Summarise a run's saved trajectories step by step: reward and length distributions and how they shift."""
    from agentrl.recipes.inspect_run import InspectError, inspect_run

    try:
        inspect_run(run_dir, plot=plot, every=every)
    except InspectError as e:
        _fail(str(e))


@app.command("view")
def view_(
    runs: list[Path] = typer.Argument(..., help="Run folders (of `agentrl run` or `agentrl eval`); two or more are "
                                               "overlaid and compared."),
    export: Path | None = typer.Option(None, "--export", help="Write one self-contained HTML file here instead of "
                                                              "serving."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; any other than loopback needs --token."),
    port: int = typer.Option(8100, help="Port (0 picks a free one)."),
    token: str = typer.Option("", "--token", envvar="AGENTRL_VIEW_TOKEN", show_default=False,
                              help="Token the browser must present (open /?token=TOKEN once; env var "
                                   "AGENTRL_VIEW_TOKEN)."),
    allowed_host: list[str] = typer.Option(
        [], "--allowed-host", help="Another name the browser may call the viewer by (repeatable; '*' allows any)."),
) -> None:
    """See inside runs in a browser, live: curves, episodes turn by turn, every token's mask, log-probs and weights."""
    from agentrl.view import ViewError, export_html, serve_view

    try:
        if export is not None:
            typer.echo(f"exported to {export_html(runs, export)}")
            return
        serve_view(runs, host=host, port=port, token=token, extra_hosts=allowed_host, say=typer.echo)
    except ViewError as e:
        _fail(str(e))


@app.command("check-template")
def check_template(
    model: str = typer.Option(..., "--model", help="Built-in model, local HF folder or hub id."),
    conversations: Path | None = typer.Option(None, "--conversations",
                                              help="JSON/JSONL conversations or a run's trajectories.jsonl."),
    family: str | None = typer.Option(None, "--family", help="Force a template family instead of detecting it."),
    thinking: bool | None = typer.Option(None, "--thinking/--no-thinking", help="Template thinking switch."),
) -> None:
    """Check a chat template: parity with the official file, which turns rewrite history and why, token drift."""
    from agentrl.chat.families import UnknownFamilyError
    from agentrl.chat.roundtrip import template_report
    from agentrl.models import UnknownModelError

    try:
        report = template_report(model, conversations, family=family, enable_thinking=thinking)
    except (UnknownModelError, UnknownFamilyError, ValueError) as e:
        _fail(str(e))
    for line in report.lines():
        typer.echo(line)
    raise typer.Exit(0 if report.incremental_ok else 1)


@app.command("serve")
def serve_(
    model: str = typer.Option(..., "--model", help="Built-in model, run checkpoint folder or hub id."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; any other than loopback needs --token."),
    port: int = typer.Option(8000, help="Port (0 picks a free one)."),
    engine: str = typer.Option("auto", "--engine", help="Inference engine: auto (vLLM where it serves the model), "
                                                        "hf or vllm."),
    engine_dtype: str = typer.Option("", "--engine-dtype", help="Engine precision (default: the model's)."),
    engines: int = typer.Option(1, "--engines", help="Engine replicas (>1: Ray actors)."),
    family: str = typer.Option("", "--family", help="Chat-template family (default: detected from the tokenizer)."),
    thinking: bool | None = typer.Option(None, "--thinking/--no-thinking", help="Template thinking switch."),
    max_tokens: int = typer.Option(256, "--max-tokens", help="New tokens per call when the request does not say."),
    max_context_tokens: int = typer.Option(4096, "--max-context-tokens", help="Longest prompt + reply per call."),
    record: str = typer.Option("", "--record", help="Append every sampled call as a JSON line to this file."),
    seed: int = typer.Option(0, "--seed", help="Engine seed."),
    token: str = typer.Option("", "--token", envvar="AGENTRL_SERVE_TOKEN", show_default=False,
                              help="Bearer token clients must send as their API key (env var AGENTRL_SERVE_TOKEN)."),
    allowed_host: list[str] = typer.Option(
        [], "--allowed-host", help="Another name clients may call the server by in the Host header (repeatable; "
                                   "loopback names, or the bound name, always pass; '*' allows any)."),
    max_sessions: int = typer.Option(10_000, "--max-sessions", help="Sessions kept in memory (least recently used "
                                                                    "evicted past it; --record keeps them on disk)."),
    max_session_calls: int = typer.Option(1_000, "--max-session-calls", help="Calls one session may make."),
    max_memory_mib: int = typer.Option(1024, "--max-memory-mib",
                                       help="MiB of recorded calls kept in memory (least recently used sessions "
                                            "evicted past it)."),
) -> None:
    """Serve a model behind an OpenAI-compatible /v1/chat/completions and /v1/completions, recording every call."""
    from agentrl.config import ConfigError, ContextConfig, EngineConfig
    from agentrl.models import UnknownModelError, check_model_name
    from agentrl.recipes.serve import ServeConfig, ServeError, serve

    try:
        check_model_name(model)
        cfg = ServeConfig(model=model, engine=EngineConfig(kind=engine, dtype=engine_dtype, replicas=engines),
                          context=ContextConfig(chat_family=family, enable_thinking=thinking,
                                                max_context_tokens=max_context_tokens),
                          host=host, port=port, max_tokens=max_tokens, seed=seed, record=record, token=token,
                          allowed_hosts=tuple(allowed_host), max_sessions=max_sessions,
                          max_session_calls=max_session_calls, max_memory_mib=max_memory_mib)
        serve(cfg, say=typer.echo)
    except (ServeError, ConfigError, UnknownModelError) as e:
        _fail(str(e))


@webshop_app.command("serve")
def webshop_serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind (keep it on loopback unless you mean it)."),
    port: int = typer.Option(3000, help="Port (0 picks a free one)."),
    env_arg: list[str] = typer.Option([], "--env-arg", help="WebShop constructor argument KEY=VALUE (repeatable)."),
) -> None:
    """Serve the WebShop pages as HTML for a person to shop in a browser (same pages, actions and score)."""
    from agentrl.envs.webshop.server import serve

    if not 0 <= port <= 65535:
        _fail(f"--port must be in 0..65535 (0 picks a free one), got {port}")
    try:
        serve(host=host, port=port, **_parse_kwargs(env_arg))
    except (TypeError, ValueError, OSError) as e:
        _fail(f"cannot serve WebShop: {e}", FAILURE if isinstance(e, OSError) else USAGE_ERROR)


@env_app.command("serve")
def env_serve(
    env: str = typer.Option(..., "--env", help=_ENV_HELP),
    env_arg: list[str] = typer.Option([], "--env-arg", help="Env constructor argument KEY=VALUE (repeatable)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; any other than loopback needs --token."),
    port: int = typer.Option(8000, help="Port (0 picks a free one)."),
    max_sessions: int = typer.Option(256, "--max-sessions", help="Sessions open at once (one env each)."),
    idle_timeout: float = typer.Option(300.0, "--idle-timeout", help="Close a session idle this many seconds."),
    token: str = typer.Option("", "--token", envvar="AGENTRL_ENV_TOKEN", show_default=False,
                              help="Bearer token clients must send (env var AGENTRL_ENV_TOKEN)."),
    max_rss_gib: float = typer.Option(0.0, "--max-rss-gib", help="Refuse new sessions above this memory (0: off)."),
    threads: int = typer.Option(8, "--threads", help="Worker threads stepping the envs."),
    allowed_host: list[str] = typer.Option(
        [], "--allowed-host", help="Another name clients may call the server by in the Host header (repeatable; "
                                   "loopback names, or the bound name, always pass; '*' allows any)."),
    max_body_mib: float = typer.Option(8.0, "--max-body-mib", help="Largest request body and WebSocket message."),
    read_timeout: float = typer.Option(30.0, "--read-timeout",
                                       help="Seconds a client may take to send a request's headers, and its body."),
) -> None:
    """Serve an env over HTTP (agentrl's --env http://HOST:PORT/NAME) and WebSocket (OpenEnv clients)."""
    import agentrl
    from agentrl.extras import MissingExtraError, install_hint

    try:
        from agentrl.env_server import ServeError, ServeSettings, serve
    except ImportError as e:  # FastAPI and uvicorn are in the base install: only a broken install lacks them
        _fail(f"agentrl env serve needs FastAPI and uvicorn: {install_hint('serve')} ({e})", FAILURE)
    try:
        from agentrl.http_guard import HttpLimits

        if not (max_body_mib > 0 and read_timeout > 0):
            _fail(f"--max-body-mib and --read-timeout must be > 0, got {max_body_mib} and {read_timeout}")
        limits = HttpLimits(max_body_bytes=int(max_body_mib * 2**20), ws_max_size=int(max_body_mib * 2**20),
                            header_timeout=read_timeout, body_timeout=read_timeout)
        settings = ServeSettings(env, _parse_kwargs(env_arg), host=host, port=port, max_sessions=max_sessions,
                                 idle_timeout=idle_timeout, token=token, max_rss_gib=max_rss_gib, threads=threads,
                                 allowed_hosts=tuple(allowed_host), limits=limits)
        serve(settings, announce=lambda line: typer.echo(line, err=True))
    except ServeError as e:
        _fail(str(e))
    except (agentrl.UnknownEnvError, MissingExtraError) as e:
        _fail(str(e), _exit_code(e))
    except (TypeError, ValueError, OSError) as e:  # the env's own message names the bad argument
        _fail(f"cannot serve {env!r}: {e}", FAILURE if isinstance(e, OSError) else USAGE_ERROR)
    except KeyboardInterrupt:
        pass


def main() -> None:
    """Entry point of the `agentrl` script."""
    try:
        app()
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
