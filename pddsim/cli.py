"""Command line: `pddsim run | compare | capacity | sweep | plan | report | diff | check | validate |
schema | trace | bench | perf`.

Bad input ends with one line on stderr and exit status 2; an internal error with one line and exit
status 1 (`--debug`: the traceback).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import traceback
from pathlib import Path

from pddsim.config import AgentSpec, bundled
from pddsim.errors import InputError
from pddsim.provenance import COMMAND, provenance
from pddsim.schema import validated

DEFAULT_CONFIG = bundled("same_dc_pd.yaml")


# what each command's --help ends with: a command line that works as it stands
EXAMPLES = {
    "pddsim": "pddsim run paper/pdd --json\n  pddsim compare same_dc_pd pdd --no-capacity",
    "run": "pddsim run paper/pdd --seed 1 --json > run.json\n"
           "  pddsim run pdd --trace my_trace.jsonl --out runs/pdd",
    "compare": "pddsim compare same_dc_pd cross_dc_pd pdd --no-capacity\n  pddsim compare   "
               "# the paper scenario, capacities searched (minutes)",
    "faults": "pddsim faults faults/same_dc_pd faults/pdd --plot faults.png",
    "elastic": "pddsim elastic paper/same_dc_pd paper/cross_dc_pd paper/pdd   # a day (minutes)\n"
               "  pddsim elastic paper/pdd --day-s 3600 --curve 0:0.2,12:1 --json",
    "capacity": "pddsim capacity paper/pdd --json   # steady state over a horizon (minutes)",
    "map": "pddsim map --x gpu_b_premium=0,0.3,1 --y output_mean=1000,2000 --plot map.png",
    "sweep": "pddsim sweep pdd --grid wan.bandwidth_gbps=10,20,40 --out sweep.csv",
    "plan": "pddsim plan same_dc_pd --vary clusters.a.instances.0.count=2..4 "
            "--vary clusters.a.instances.1.count=2..6 --budget 200 --out plan",
    "check": "pddsim check golden/paper_small",
    "bench": "pddsim bench handoff --runs 200",
    "bench handoff": "pddsim bench handoff --runs 200 --json",
    "bench perf": "pddsim bench perf --against benchmarks/measured/iterations.csv --engine vllm",
    "bench serve": "pddsim bench serve --against aic_silicon_fit.csv --limit 50",
    "bathtub": "pddsim bathtub paper/pdd --hits 0:1:0.1 --plot bathtub.png",
    "report": "pddsim run pdd --out runs/pdd && pddsim report runs/pdd -o pdd.html\n"
              "  pddsim report plan -o plan.html   # a plan's --out: its heatmap and Pareto front",
    "diff": "pddsim run pdd --out runs/a && pddsim run pdd --seed 1 --out runs/b && "
            "pddsim diff runs/a runs/b -o diff.html",
    "perf": "pddsim perf import --from vidur mlp.csv attention.csv --model llama-3.1-70b "
            "--gpu h100-sxm --tp 1 -o table.csv",
    "catalog": "pddsim catalog list gpus\n  pddsim catalog show h800\n"
               "  pddsim run pdd --catalog my_hw.yaml --set clusters.b.gpu=my-gpu",
    "configs": "pddsim configs list\n  pddsim run paper/pdd",
    "validate": "pddsim validate my_scenario.yaml --catalog my_hw.yaml",
    "schema": "pddsim schema > config.schema.json",
    "trace": "pddsim trace gen --out agent.jsonl --sessions 100",
    "trace gen": "pddsim trace gen --out agent.jsonl --sessions 100 --seed 1",
    "trace stats": "pddsim trace stats agent.jsonl --lru-tokens 1000000",
}
EXAMPLES["perf import"] = EXAMPLES["perf"]


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2 like any other bad input; every
    (sub)command takes `--debug` and ends its help with an example."""

    def __init__(self, *args, **kwargs):
        example = EXAMPLES.get(kwargs.get("prog", "pddsim").removeprefix("pddsim ").strip())
        if example:
            kwargs.update(epilog=f"example:\n  {example}",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                          help="on an internal error, print the traceback")

    def error(self, message):
        raise InputError(message)


def _json(obj) -> str:
    return json.dumps(obj, indent=2, allow_nan=True, default=float)


def _progress(total: int | None, quiet: bool):
    from tqdm import tqdm
    return tqdm(total=total, unit="req", file=sys.stderr, delay=2.0, mininterval=0.5,
                disable=quiet or not sys.stderr.isatty())


def _trace_values(args) -> dict:
    """`--trace PATH` replaces the config's workload source (the path taken literally)."""
    if not getattr(args, "trace", None):
        return {}
    return {"workload.trace": str(Path(args.trace).resolve()), "workload.synthetic": None}


def _observe_values(args) -> dict:
    """`run`'s observation flags, as config fields (so a run is described by its config alone)."""
    values = {}
    if getattr(args, "sample_s", None) is not None:
        values["observe.sample_s"] = args.sample_s
    if getattr(args, "timeline", None):
        values["observe.timeline"] = True
    if getattr(args, "timeline_limit", None) is not None:
        values["observe.timeline_limit"] = args.timeline_limit
    return values


def _config(args):
    from pddsim.config import load_config
    return load_config(args.config or DEFAULT_CONFIG, args.set or [],
                       {**_trace_values(args), **_observe_values(args)})


def cmd_run(args) -> int:
    from pddsim.metrics import by_bucket, headline, stage_table
    from pddsim.sim import load_workload, prepare_out_dir, simulate
    cfg = _config(args)
    workload = load_workload(cfg)
    if args.out:
        prepare_out_dir(args.out)
    with _progress(len(workload), args.quiet) as bar:
        result = simulate(cfg, workload, args.seed, on_progress=bar.update,
                          check_invariants=args.check_invariants)
    if args.out:
        result.write(args.out, args.out_format)
    if args.timeline:
        assert result.timeline is not None      # simulate keeps one when asked for a timeline
        result.timeline.write(args.timeline)
        if short := result.timeline.shortfall(result.summary["sim_duration_s"]):
            print(f"pddsim: timeline {args.timeline}: {short}", file=sys.stderr)
    if args.json:
        print(_json({**result.summary, "provenance": result.provenance()}))
    else:
        shown = headline(result.summary)
        width = max(map(len, shown))
        for key, value in shown.items():
            value = f"{value:.6g}" if isinstance(value, float) else value
            print(f"{key:<{width}}  {value}")
        print("\nwhere the time went (seconds per request, completed requests):")
        print(stage_table(result.summary).to_string(float_format=lambda v: f"{v:.4g}"))
    if args.by_bucket:
        print(by_bucket(result.requests).to_string(float_format=lambda v: f"{v:.3f}"),
              file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_compare(args) -> int:
    from pddsim.config import load_config
    from pddsim.experiments import paper
    from pddsim.experiments.compare import compare, format_comparison, mixed_slo
    from pddsim.sim import load_workload
    paths = args.configs or paper.PAPER_CONFIGS
    overrides = (args.set or []) + [f"{k}={json.dumps(v)}" for k, v in _trace_values(args).items()]
    best_split = args.best_split
    capacity = best_split or (not args.no_capacity and (args.capacity or not args.configs))
    if best_split and args.no_capacity:
        raise InputError("--best-split measures capacities: it cannot go with --no-capacity")
    if (args.budget is not None or args.objective != "capacity") and not best_split:
        raise InputError("--budget, --objective: only with --best-split")
    if args.configured_split and (args.configs or best_split):
        raise InputError("--configured-split: only for the paper scenario (no CONFIG), without "
                         "--best-split")
    planned = not args.configs and not best_split and not args.configured_split
    if planned:
        configs, budget = paper.planned_configs(overrides)
    elif best_split:
        from pddsim.experiments.plan import best_splits, split_of
        with _backend(args) as backend, _progress(None, args.quiet) as bar:
            bar.unit = "run"
            chosen = best_splits(paths, overrides, budget=args.budget, objective=args.objective,
                                 seed=args.seed,
                                 backend=backend, cache=_cache(args), on_progress=bar.update)
        configs = [cfg for cfg, _ in chosen]
    else:
        configs = [load_config(p, overrides) for p in paths]
    if mixed := mixed_slo(configs):
        if not args.allow_mixed_slo:
            raise InputError(f"compare: {mixed}; give them one (--set slo.ttft_s=...) or pass "
                             "--allow-mixed-slo")
        print(f"pddsim: note: {mixed}", file=sys.stderr)
    workload = load_workload(configs[0])          # one workload for every system
    if args.plot and not args.loads:
        raise InputError("--plot needs --loads")
    if args.loads:
        return _compare_loads(args, configs, workload)
    # a capacity search runs each system an unknown number of times: count requests, no total
    total = None if capacity else len(configs) * len(workload)
    with _progress(total, args.quiet) as bar:
        summaries = compare(configs, workload, seed=args.seed, capacity=capacity,
                            on_progress=bar.update, out_dir=args.out)
    if args.json:
        rows = [{**s, "provenance": provenance(cfg, args.seed)} for s, cfg in zip(summaries, configs)]
        if best_split:          # how each system's split was found: what the plan simulated
            for row, (cfg, found) in zip(rows, chosen):
                row["best_split"] = {"values": split_of(cfg), "space": found.space,
                                     "simulated": found.simulated, "runs": found.runs,
                                     "cached": found.cached}
        print(_json(rows))
        return 0
    if best_split:
        print(f"each system's best split within ${chosen[0][1].budget:g}/h "
              f"({args.objective}; simulated "
              + ", ".join(f"{r.simulated} of {r.space} points, {r.runs_text()}" for _, r in chosen)
              + ")")
    if planned:
        print(f"each system at its best split within ${budget:g}/h (the most capacity), as "
              f"--best-split planned it ({paper.PLANNED_SPLITS.parent.name}/"
              f"{paper.PLANNED_SPLITS.name}); --configured-split: the configs' own splits")
    print(format_comparison(summaries))
    if not args.configs:
        print()
        print(paper.format_figures(paper.figures_table(*summaries)))
    return 0


def cmd_faults(args) -> int:
    from pddsim.config import load_config
    from pddsim.experiments.faults import fault_study, format_fault_study, plot_fault_study
    from pddsim.sim import load_workload
    configs = [load_config(p, args.set or []) for p in args.configs]
    workload = load_workload(configs[0])          # one workload for every system
    with _progress(len(configs) * len(workload), args.quiet) as bar:
        study = fault_study(configs, workload, seed=args.seed, on_progress=bar.update)
    if args.plot:
        plot_fault_study(study, args.plot)
    if args.json:
        print(_json({"summaries": study.summaries,
                     "provenance": [provenance(cfg, args.seed) for cfg in configs],
                     "per_minute": study.per_minute.to_dict(orient="records"),
                     "faults": [{"start_s": s, "end_s": e, "what": w} for s, e, w in study.faults]}))
        return 0
    print(format_fault_study(study))
    return 0


def cmd_elastic(args) -> int:
    from pddsim.config import load_config
    from pddsim.experiments.elastic import day_study, format_day_study
    configs = [load_config(p, args.set or []) for p in args.configs]
    study = day_study(configs, curve=args.curve, day_s=args.day_s, seed=args.seed)
    print(_json(study.table.to_dict(orient="records")) if args.json else format_day_study(study))
    return 0


def cmd_bathtub(args) -> int:
    from dataclasses import asdict

    from pddsim.experiments.bathtub import POLICIES, Stream, bathtub, parse_hits, plot
    cfg = _config(args)
    hits = parse_hits(args.hits)
    given = {"context_tokens": args.context, "output_tokens": args.output, "rate_rps": args.rate,
             "requests": args.requests, "block_tokens": args.block}
    stream = Stream(**{k: v for k, v in given.items() if v is not None})
    policies = tuple(args.policy) if args.policy else POLICIES
    with _progress(len(hits) * len(policies), args.quiet) as bar:
        bar.unit = "point"
        points = bathtub(cfg, hits, stream, policies, seed=args.seed, on_point=bar.update)
    if args.plot:
        plot(points, args.plot, f"{cfg.name}: {stream.context_tokens} tokens, "
             f"{stream.rate_rps:g} req/s")
    if args.json:
        print(_json({"points": points, "provenance": provenance(cfg, args.seed, stream=asdict(stream))}))
        return 0
    import pandas as pd
    table = pd.DataFrame(points).pivot(index="hit_rate", columns="policy",
                                       values=["throughput_rps", "goodput_rps", "ttft_p50_s"])
    print(table[[c for c in table.columns if c[1] in policies]].to_string(
        float_format=lambda v: f"{v:.3f}"))
    return 0


def _compare_loads(args, configs, workload) -> int:
    from pddsim.experiments.compare import compare_across_loads, format_loads, parse_loads, plot_loads
    loads = parse_loads(args.loads)
    with _progress(None, args.quiet) as bar:
        result = compare_across_loads(configs, workload, loads, seed=args.seed, on_progress=bar.update)
    if args.plot:
        plot_loads(result, args.plot)
    print(_json({**result.to_json(), "provenance": [provenance(cfg, args.seed) for cfg in configs]})
          if args.json else format_loads(result))
    return 0


def cmd_report(args) -> int:
    from pddsim.report import write_report
    print(write_report(args.folder, args.output))
    return 0


def cmd_diff(args) -> int:
    from pddsim.report import write_diff
    print(write_diff(args.run_a, args.run_b, args.output))
    return 0


def cmd_capacity(args) -> int:
    from pddsim.experiments.capacity import find_capacity
    from pddsim.sim import load_workload
    cfg = _config(args)
    # a search runs the workload an unknown number of times: requests simulated, no total
    with _progress(None, args.quiet or args.json) as bar:
        cap = find_capacity(cfg, load_workload(cfg), seed=args.seed, on_progress=bar.update)
    summary = cap.summary()
    if args.json:
        print(_json({**summary, "provenance": cap.result.provenance()}))
        return 0
    where = f"{cap.knob} {cap.load:.4g}, SLO target {cfg.slo.target:.0%}"
    measure = "steady-state" if cap.knob == "session_rate_rps" else "achieved"
    runs = f"{cap.runs} runs, {cap.stopped_early} stopped early"
    if cap.status == "never stationary":
        print(f"capacity not found: no load tried became stationary, down to {where} ({runs})")
    elif cap.status == "never saturated":
        more = "" if cap.knob == "session_rate_rps" else \
            " (the workload's sessions run out before the SLO breaks: give it more sessions)"
        print(f"capacity not found: the SLO target held at every load tried, up to "
              f"{cap.lower_bound_rps:.4g} req/s {measure} ({where}); that rate is a lower bound"
              f"{more} ({runs})")
    else:
        interval = f" [95%: {cap.interval[0]:.4g}, {cap.interval[1]:.4g}]" if cap.interval else ""
        print(f"capacity {cap.capacity_rps:.4g} req/s {measure}{interval} ({where}; the highest "
              f"passing load below the lowest failing one tried, {runs}): goodput "
              f"{cap.goodput_rps:.4g} req/s, cost ${summary['cost_per_hour']:.2f}/h, "
              f"BCR {cap.bcr:.4g} req/$")
    return 0


def cmd_map(args) -> int:
    from pddsim.experiments import paper
    from pddsim.experiments.pdd_map import format_map, parse_factor, pdd_map, plot_map
    x, y = parse_factor(args.x, "--x"), parse_factor(args.y, "--y")
    baseline, pdd = args.baseline or paper.PAPER_CONFIGS[0], args.pdd or paper.PAPER_CONFIGS[2]
    # the paper's systems start at their planned splits (a config given starts as it is)
    own_baseline, own_pdd = ([] if given else paper.planned_counts(path)
                             for given, path in ((args.baseline, baseline), (args.pdd, pdd)))
    with _backend(args) as backend, _progress(None, args.quiet) as bar:
        bar.unit = "search"
        rows = pdd_map(baseline, pdd, x, y, args.set or [], own=(own_baseline, own_pdd),
                       fixed_split=args.fixed_split, seed=args.seed, backend=backend,
                       cache=_cache(args), on_progress=bar.update)
    if args.plot:
        plot_map(rows, x[0], y[0], args.plot)
    print(_json(rows) if args.json else format_map(rows, x[0], y[0]))
    return 0


def _backend(args):
    from pddsim.experiments.backends import open_backend
    return open_backend(args.backend, jobs=args.jobs, address=args.address)


def _cache(args):
    from pddsim.experiments.result_cache import ResultCache
    return ResultCache(args.cache) if args.cache else None


def cmd_sweep(args) -> int:
    from pddsim.experiments.sweep import format_sweep, grid_points, sweep, table_writer
    from pddsim.provenance import write as write_provenance
    write = table_writer(args.out) if args.out else None
    points = grid_points(args.grid)
    cache = _cache(args)
    with _backend(args) as backend, _progress(len(points), args.quiet) as bar:
        bar.unit = "point"
        table = sweep(args.config or DEFAULT_CONFIG, args.grid, args.set or [], capacity=args.capacity,
                      seed=args.seed, on_progress=bar.update, backend=backend, cache=cache)
    if write:
        write(table)
        write_provenance(provenance(_config(args), args.seed, grid=args.grid, capacity=args.capacity),
                         Path(f"{args.out}.provenance.json"))
    if args.json:
        print(_json(table.to_dict(orient="records")))
    else:
        print(format_sweep(table, list(points[0])))
    return 0


def cmd_plan(args) -> int:
    from pddsim.experiments.plan import format_plan, plan, prepare_out, write_outputs
    from pddsim.provenance import write as write_provenance
    if args.out:
        prepare_out(args.out)
    cache = _cache(args)
    with _backend(args) as backend, _progress(None, args.quiet) as bar:
        bar.unit = "run"

        def total(n):
            bar.total = n
            bar.refresh()

        result = plan(args.config or DEFAULT_CONFIG, args.vary, args.set or [], budget=args.budget,
                      load=args.load, objective=args.objective, seeds=args.seeds, seed=args.seed,
                      backend=backend, cache=cache, on_progress=bar.update, on_total=total)
    prov = provenance(_config(args), args.seed, vary=args.vary, budget=args.budget, load=args.load,
                      objective=args.objective, seeds=args.seeds)
    if args.out:
        write_outputs(result, args.out)
        write_provenance(prov, Path(args.out) / "provenance.json")
    print(_json({**result.to_json(), "provenance": prov}) if args.json else format_plan(result))
    return 0


def cmd_check(args) -> int:
    from pddsim.config import locate
    from pddsim.experiments.golden import check_golden, format_rows
    rows = check_golden(locate(args.golden), update=args.update)     # a bundled one by name too
    print(format_rows(rows))
    moved = [r for r in rows if not r["ok"]]
    if moved and not args.update:
        print(f"{len(moved)} pinned figure(s) moved beyond tolerance", file=sys.stderr)
        return 1
    return 0


def cmd_bench_handoff(args) -> int:
    from pddsim.config import load_config
    from pddsim.experiments.handoff_bench import (
        HandoffBenchSpec,
        format_bench,
        handoff_microbenchmark,
        scenario_handoff,
    )
    spec = HandoffBenchSpec(runs=args.runs)
    result = handoff_microbenchmark(spec, seed=args.seed)
    result["scenario"] = scenario_handoff(load_config(args.config, args.set), spec, seed=args.seed)
    print(_json(result) if args.json else format_bench(result))
    return 0


def cmd_bench_perf(args) -> int:
    from pddsim import catalog
    from pddsim.experiments.perf_bench import (
        compare,
        format_report,
        profile_with,
        read_measured,
        roofline_of,
        summarise,
        table_of,
    )
    measured = read_measured(Path(args.against))
    names = args.engine or sorted(catalog.engines())
    settings = args.set or []
    what_if = f" [{', '.join(settings)}]" if settings else ""
    profiles = {f"roofline/{n}{what_if}": profile_with(n, settings) for n in names}
    predictors = {k: roofline_of(p) for k, p in profiles.items()}
    fitted_to = {k: p.fitted_to for k, p in profiles.items()}
    for path in args.table or []:
        name = f"table/{path}"
        predictors[name], fitted_to[name] = table_of(Path(path))
    cases = compare(measured, predictors, fitted_to)
    if args.cases:
        cases.to_csv(args.cases, index=False)
    summary = summarise(cases)
    print(_json(summary) if args.json else format_report(summary))
    return 0


def cmd_bench_serve(args) -> int:
    from pddsim.experiments.serve_bench import (
        cases,
        check_groups,
        check_pins,
        engine_overrides,
        format_report,
        pinned_figures,
        read_rows,
        summarise,
    )
    if args.update and not args.check:
        raise InputError("--update goes with --check PINS.json")
    pins = None
    if args.check and not args.update:
        try:
            pins = json.loads(Path(args.check).read_text())
        except OSError as e:
            raise InputError(f"{args.check}: cannot read pins ({e.strerror})") from None
        except ValueError as e:
            raise InputError(f"{args.check}: not JSON ({e})") from None
    rows = read_rows(Path(args.against))
    by = args.by or []
    check_groups(rows.columns, by)              # before the replays, not after them
    if args.limit:
        rows = rows.iloc[:args.limit]
    overrides = engine_overrides(args.set or [])
    with _backend(args) as backend, _progress(len(rows), args.quiet) as bar:
        table = cases(rows, backend, args.engine, overrides, args.rounds,
                      on_done=bar.update)
    if args.cases:
        table.to_csv(args.cases, index=False)
    summary = summarise(table, by)
    print(_json(summary) if args.json else format_report(summary))
    if args.update:
        Path(args.check).write_text(json.dumps(pinned_figures(summary), indent=2) + "\n")
    if pins is not None:
        moved = check_pins(summary, pins)
        for line in moved:
            print(f"MOVED {line}", file=sys.stderr)
        return 1 if moved else 0
    return 0


def cmd_perf_import(args) -> int:
    from pddsim.engine.perf_import import import_table
    prov = import_table(args.source, [Path(f) for f in args.files], Path(args.out), model=args.model,
                        gpu=args.gpu, tp=args.tp, source_model=args.source_model,
                        source_gpu=args.source_gpu, commit=args.commit, licence=args.licence)
    print(f"wrote {args.out} ({prov['cells']} cells) and {args.out}.provenance.json")
    return 0


def cmd_validate(args) -> int:
    from pddsim.system.deployment import check_fits
    cfg = _config(args)
    check_fits(cfg)
    print(f"{args.config}: ok ({cfg.name})")
    return 0


def cmd_schema(args) -> int:
    from pddsim.config import schema
    print(_json(schema()))
    return 0


def cmd_trace_gen(args) -> int:
    from pddsim.workload import synthetic
    from pddsim.workload.readers import write_mooncake, write_native
    knobs = {name: getattr(args, name) for name in AgentSpec.model_fields
             if getattr(args, name) is not None}
    workload = synthetic.agent_workload(validated(AgentSpec, knobs, "trace gen"), seed=args.seed)
    (write_native if args.format == "native" else write_mooncake)(workload, args.out)
    print(f"{args.out}: {len(workload)} requests, {workload.sessions} sessions", file=sys.stderr)
    return 0


def cmd_trace_stats(args) -> int:
    from pddsim.workload.readers import read_workload
    from pddsim.workload.stats import format_stats, plot_bucket_shares, trace_stats
    workload = read_workload(args.path, args.format, shared_prefix=args.shared_prefix)
    stats = trace_stats(workload, lru_capacity_tokens=args.lru_tokens, window_s=args.window)
    if args.plot:
        plot_bucket_shares(workload, args.plot, window_s=args.window,
                           lru_capacity_tokens=args.lru_tokens)
    print(_json(stats) if args.json else format_stats(stats))
    return 0


def cmd_catalog(args) -> int:
    from pddsim.catalog import Catalog, with_files
    known = validated(Catalog, with_files({"include": args.catalog or []}, Path(".")), "--catalog")
    print(known.listing(args.what) if args.action == "list" else known.entry_yaml(args.what), end="")
    return 0


def cmd_configs(args) -> int:
    from pddsim.config import bundled_scenarios
    for name, cfg in bundled_scenarios().items():
        gpus = "+".join(dict.fromkeys(c.gpu for c in cfg.clusters.values()))
        print(f"{name:<22} {cfg.name:<22} {cfg.model} on {gpus}")
    return 0


def _add_catalog_arg(p):
    p.add_argument("--catalog", action="append", metavar="FILE",
                   help="GPUs, models and engine profiles of your own (sections gpus, models, "
                   "engines, each as in pddsim/data/); repeatable")


def _catalog_overrides(args) -> None:
    """`--catalog FILE` is `--set catalog.include+=FILE`: wherever a command loads configs."""
    files = getattr(args, "catalog", None) or []
    args.set = [f"catalog.include+={json.dumps(str(Path(f).resolve()))}" for f in files] + (
        getattr(args, "set", None) or [])


def _add_config_args(p, *, trace=True):
    _add_catalog_arg(p)
    p.add_argument("config", nargs="?", help="scenario YAML, or a bundled scenario by name "
                   f"(`pddsim configs list`; default: {DEFAULT_CONFIG.stem})")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config field by dotted path, e.g. wan.bandwidth_gbps=20")
    if trace:
        p.add_argument("--trace", metavar="PATH", help="replay this trace instead of the config's")


def _add_backend_args(p, cache: bool = True):
    p.add_argument("--backend", choices=("processes", "ray"), default="processes",
                   help="local worker processes (default) or a Ray cluster")
    p.add_argument("--address", metavar="HOST:PORT", help="Ray cluster (default: start a local one)")
    p.add_argument("--jobs", type=int, metavar="N",
                   help="local workers (default: one per CPU; 1 runs in this process)")
    if cache:
        p.add_argument("--cache", metavar="DIR", help="keep finished points here and reuse them (resume)")


def parser() -> Parser:
    from pddsim.version import __version__
    top = Parser(prog="pddsim", description="Simulate cross-datacenter PD / PDD LLM serving.")
    top.add_argument("--version", action="version", version=f"pddsim {__version__}")
    sub = top.add_subparsers(dest="command", required=True, parser_class=Parser)

    run = sub.add_parser("run", help="simulate one scenario and print its summary")
    _add_config_args(run)
    run.add_argument("--seed", type=int, help="override the config's seed")
    run.add_argument("--out", metavar="DIR", help="write the run's tables (requests, instances, "
                     "links, time series, windows, sessions) and summary.json here")
    run.add_argument("--out-format", choices=("parquet", "csv", "jsonl"), default="parquet",
                     help="format of the per-request table under --out")
    run.add_argument("--sample-s", type=float, metavar="S",
                     help="time-series sampling period (default: 1/200 of the trace span; 0: off)")
    run.add_argument("--timeline", metavar="FILE.json",
                     help="write a Perfetto / chrome://tracing timeline of the run")
    run.add_argument("--timeline-limit", type=int, metavar="N",
                     help="keep at most N timeline events (default 200000)")
    run.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--by-bucket", action="store_true", help="TTFT per prefix-hit-rate bucket")
    run.add_argument("--check-invariants", action="store_true",
                     help="check the engine's rules after every event (slower; exit 1 if one breaks)")
    run.set_defaults(func=cmd_run)

    cmp_ = sub.add_parser("compare", help="several systems on one workload, side by side "
                          "(default: the PDD paper scenario, with the paper's figures)")
    cmp_.add_argument("configs", nargs="*", help="scenario YAMLs; the first one's workload is used")
    cmp_.add_argument("--set", action="append", metavar="KEY=VALUE", help="override in every config")
    _add_catalog_arg(cmp_)
    cmp_.add_argument("--trace", metavar="PATH", help="replay this trace in every system")
    cmp_.add_argument("--seed", type=int)
    cmp_.add_argument("--capacity", action="store_true",
                      help="also search each system's capacity (bisection; on for the paper scenario)")
    cmp_.add_argument("--no-capacity", action="store_true", help="skip the capacity search")
    cmp_.add_argument("--loads", metavar="START:STOP:STEP",
                      help="compare TTFT at these fractions of the first system's capacity "
                      "(e.g. 0.2:1.0:0.1; its capacity is searched first)")
    cmp_.add_argument("--plot", metavar="FILE.png", help="with --loads: TTFT and deltas vs load")
    cmp_.add_argument("--json", action="store_true",
                      help="print a list of summaries (--loads: the capacity and one row per "
                      "load and system)")
    cmp_.add_argument("--best-split", action="store_true",
                      help="plan each system's instance counts within one budget first, for a fair "
                      "comparison (a capacity search per point: slow on the paper scenario)")
    cmp_.add_argument("--objective", choices=("capacity", "bcr", "margin"), default="capacity",
                      help="--best-split's objective: the most capacity within the budget "
                      "(default), BCR or margin at capacity")
    cmp_.add_argument("--configured-split", action="store_true",
                      help="the paper scenario at its configs' own instance counts, not at each "
                      "system's planned best split")
    cmp_.add_argument("--budget", type=float, metavar="USD_PER_HOUR",
                      help="--best-split's budget (default: the first system's cost)")
    cmp_.add_argument("--allow-mixed-slo", action="store_true",
                      help="compare systems whose SLOs differ (refused otherwise: each one's "
                      "attainment, goodput and capacity are against its own SLO)")
    _add_backend_args(cmp_)
    cmp_.add_argument("--out", metavar="DIR", help="write each system's run (as `run --out` "
                      "does) to a subfolder, for `pddsim report`")
    cmp_.add_argument("--quiet", action="store_true")
    cmp_.set_defaults(func=cmd_compare)

    flt = sub.add_parser("faults", help="several systems through their configured faults on one "
                         "workload: TTFT and SLO attainment per minute, failures and retries")
    flt.add_argument("configs", nargs="+", help="scenario YAMLs with a faults section (e.g. "
                     "configs/faults/*.yaml); the first one's workload is used")
    flt.add_argument("--set", action="append", metavar="KEY=VALUE", help="override in every config")
    _add_catalog_arg(flt)
    flt.add_argument("--seed", type=int)
    flt.add_argument("--plot", metavar="FILE.png", help="TTFT P90 and SLO attainment per minute, "
                     "faults shaded")
    flt.add_argument("--json", action="store_true",
                     help="print the summaries, the per-minute table and the fault windows")
    flt.add_argument("--quiet", action="store_true")
    flt.set_defaults(func=cmd_faults)

    from pddsim.experiments.elastic import DAY_CURVE, DAY_S
    ela = sub.add_parser("elastic", help="systems over a simulated day, static at peak vs elastic "
                         "pools: GPU-hours per role, cost, SLO attainment (docs/elastic.md)")
    ela.add_argument("configs", nargs="+", help="scenarios with an agent workload (e.g. "
                     "paper/same_dc_pd paper/cross_dc_pd paper/pdd); the first one's workload is used")
    ela.add_argument("--curve", default=DAY_CURVE, help=f"the day curve 'hour:multiplier,...' of "
                     f"the session rate, the config's rate the peak (default {DAY_CURVE})")
    ela.add_argument("--day-s", type=float, default=DAY_S, help="the simulated day's length, s")
    ela.add_argument("--set", action="append", metavar="KEY=VALUE", help="override in every config")
    _add_catalog_arg(ela)
    ela.add_argument("--seed", type=int)
    ela.add_argument("--json", action="store_true", help="print the table as JSON records")
    ela.set_defaults(func=cmd_elastic)
    cap = sub.add_parser("capacity", help="highest load meeting the SLO target, as the rate "
                         "sustained there (steady state with workload.horizon_s)")
    _add_config_args(cap)
    cap.add_argument("--seed", type=int)
    cap.add_argument("--json", action="store_true", help="capacity_rps plus the run summary "
                     "(no progress bar)")
    cap.add_argument("--quiet", action="store_true", help="no progress bar")
    cap.set_defaults(func=cmd_capacity)

    mp = sub.add_parser("map", help="where PDD wins: its capacity and BCR over a baseline's on a "
                        "grid of two factors, with the break-even line")
    for flag in ("--x", "--y"):
        mp.add_argument(flag, required=True, metavar="FACTOR=V1,V2,...",
                        help="a factor and its values (gpu_b_premium, gpu_a_hbm_gb, model, "
                        "kv_bytes_per_token, output_mean, tpot_slo_s, max_batch, kv_dtype, "
                        "wan_gbps, long_prob, context_mean)")
    mp.add_argument("--baseline", metavar="CONFIG",
                    help="default: the paper's same-DC PD, from its planned split")
    mp.add_argument("--pdd", metavar="CONFIG", help="default: the paper's PDD, from its planned split")
    mp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override on both systems")
    mp.add_argument("--fixed-split", action="store_true", help="measure each system at the split "
                    "it is given (default: each at its best split for its cost, by a local search "
                    "from there at every point)")
    mp.add_argument("--seed", type=int, help="override the configs' seed")
    _add_backend_args(mp)
    mp.add_argument("--plot", metavar="FILE.png", help="draw both maps with their break-even lines")
    mp.add_argument("--json", action="store_true", help="one JSON row per grid point")
    mp.add_argument("--quiet", action="store_true", help="no progress bar")
    mp.set_defaults(func=cmd_map)

    swp = sub.add_parser("sweep", help="one scenario over a grid of config values, one row a point")
    _add_config_args(swp, trace=False)
    swp.add_argument("--grid", action="append", required=True, metavar="KEY=V1,V2,...",
                     help="values of a config field (parsed as YAML); repeat for a cartesian product")
    swp.add_argument("--seed", type=int)
    swp.add_argument("--capacity", action="store_true",
                     help="also search each point's capacity (bisection; many more runs)")
    _add_backend_args(swp)
    swp.add_argument("--out", metavar="FILE", help="write the whole table, .csv or .parquet")
    swp.add_argument("--json", action="store_true", help="print a list of row objects")
    swp.add_argument("--quiet", action="store_true")
    swp.set_defaults(func=cmd_sweep)

    pln = sub.add_parser("plan", help="search deployment shapes around a config: the best for a "
                         "budget, or the cheapest for a load")
    _add_config_args(pln, trace=False)
    pln.add_argument("--vary", action="append", required=True, metavar="PATH=A..B|V1,V2,...",
                     help="a dimension: integers A to B (A..B:STEP) or listed values; repeat")
    pln.add_argument("--budget", type=float, metavar="USD_PER_HOUR", help="cost per hour at most")
    pln.add_argument("--load", type=float, metavar="RPS", help="capacity at least this")
    pln.add_argument("--objective", choices=("bcr", "capacity", "cost", "margin"),
                     help="bcr at capacity (default), capacity, cost (least; default with --load) "
                     "or margin (revenue minus cost per hour at capacity)")
    pln.add_argument("--seeds", type=int, default=1, metavar="N",
                     help="measure each point over N seeds: mean and 95%% interval")
    pln.add_argument("--seed", type=int, help="first seed (default: the config's)")
    _add_backend_args(pln)
    pln.add_argument("--out", metavar="DIR", help="write points.parquet, heatmap.png, pareto.png")
    pln.add_argument("--json", action="store_true",
                     help="print best, pareto, points, simulated, space as one object")
    pln.add_argument("--quiet", action="store_true")
    pln.set_defaults(func=cmd_plan)

    chk = sub.add_parser("check", help="re-run pinned scenarios; exit 1 if a figure moved")
    chk.add_argument("golden", help="golden YAML file")
    chk.add_argument("--update", action="store_true", help="re-pin: write today's values")
    chk.set_defaults(func=cmd_check)

    bench = sub.add_parser("bench", help="microbenchmarks")
    bsub = bench.add_subparsers(dest="bench_command", required=True, parser_class=Parser)
    ho = bsub.add_parser("handoff", help="RLD->MD handoff of 100 tokens: ship KV vs send IDs")
    ho.add_argument("--runs", type=int, default=1000)
    ho.add_argument("--config", default=str(bundled("paper/pdd.yaml")),
                    help="also run the handoff on this scenario's MD and WAN (default: the paper PDD)")
    _add_catalog_arg(ho)
    ho.add_argument("--seed", type=int, default=0)
    ho.add_argument("--json", action="store_true")
    ho.set_defaults(func=cmd_bench_handoff)
    bp = bsub.add_parser("perf", help="predicted vs measured iteration times, error by kind/TP/source")
    bp.add_argument("--against", required=True, metavar="MEASURED.csv",
                    help="columns model,gpu,tp,tokens,attn_pairs,kv_tokens,time_ms,source")
    bp.add_argument("--engine", action="append", metavar="NAME",
                    help="engine to test (repeatable; default: every engine in the catalog)")
    bp.add_argument("--set", action="append", metavar="FIELD=VALUE",
                    help="set an engine constant in every profile tested, e.g. overhead_ms=10 "
                    "(repeatable; a profile keeps the source it was fitted to)")
    bp.add_argument("--table", action="append", metavar="TABLE.csv",
                    help="also test a measured table (from `pddsim perf import`, its provenance "
                    "sidecar beside it) on the cases of its model, GPU and TP (repeatable)")
    bp.add_argument("--cases", metavar="FILE", help="write predicted vs measured per case (CSV)")
    bp.add_argument("--json", action="store_true")
    bp.set_defaults(func=cmd_bench_perf)

    bs = bsub.add_parser("serve", help="predicted vs measured serving benchmarks of real engines "
                         "(aiconfigurator silicon-sample CSV): mean TTFT and TPOT error by group")
    bs.add_argument("--against", required=True, metavar="FILE.csv",
                    help="measured benchmarks in the aiconfigurator silicon-sample format")
    bs.add_argument("--engine", metavar="NAME",
                    help="replay every row under this engine (default: the engine named like each "
                    "row's backend)")
    bs.add_argument("--set", action="append", metavar="FIELD=VALUE",
                    help="set an engine constant for every row, e.g. frontend_ms=20 (repeatable)")
    bs.add_argument("--rounds", type=int, default=10, metavar="R",
                    help="measured requests per client in the benchmark that produced the rows "
                    "(10, fitted to the bundled rows)")
    bs.add_argument("--limit", type=int, metavar="N", help="only the first N rows")
    bs.add_argument("--cases", metavar="OUT.csv", help="write every row with its prediction")
    bs.add_argument("--by", action="append", metavar="COLUMN",
                    help="also report the figures per value of this column of the file (or "
                    "engine, concurrency), e.g. backend_version (repeatable)")
    bs.add_argument("--check", metavar="PINS.json", help="exit 1 if a median error rises more than "
                    "2 points past its pin (overall, per model and per backend with >= 20 rows) "
                    "or fewer rows are compared")
    bs.add_argument("--update", action="store_true", help="with --check: write the pins instead")
    bs.add_argument("--json", action="store_true")
    bs.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_backend_args(bs, cache=False)
    bs.set_defaults(func=cmd_bench_serve)

    tub = sub.add_parser("bathtub", help="throughput vs prefix hit rate at a fixed context "
                         "length and load, per chunk-packing policy")
    _add_config_args(tub, trace=False)
    tub.add_argument("--hits", default="0:1:0.025", help="START:STOP:STEP or a comma list")
    # no defaults here: an unset knob keeps bathtub.Stream's, the one set the API has too
    tub.add_argument("--context", type=int, help="prompt tokens of every request (default 20480)")
    tub.add_argument("--output", type=int, help="output tokens of every request (default 16)")
    tub.add_argument("--rate", type=float, help="Poisson arrivals per second (default 20: it "
                     "saturates the prefill pool of the bundled configs at low hit rates, so "
                     "throughput there is its capacity)")
    tub.add_argument("--requests", type=int, help="requests per point (default 200)")
    tub.add_argument("--block", type=int, help="prefix-cache block, tokens (default 64)")
    tub.add_argument("--policy", action="append", choices=("packed", "alone"),
                     help="chunk packing policies to draw (default both)")
    tub.add_argument("--seed", type=int)
    tub.add_argument("--plot", metavar="FILE.png")
    tub.add_argument("--json", action="store_true",
                     help='{"points": [{policy, hit_rate, goodput_rps, throughput_rps, '
                     'ttft_p50_s, measured_hit_rate}, ...]}')
    tub.add_argument("--quiet", action="store_true")
    tub.set_defaults(func=cmd_bathtub)

    rep = sub.add_parser("report", help="one self-contained interactive HTML page (opens "
                         "offline) from what `run`, `compare`, `plan` or `sweep` wrote with --out")
    rep.add_argument("folder", help="a run's --out folder, one holding several runs, a plan's "
                     "--out folder or a sweep's table (.parquet / .csv)")
    rep.add_argument("-o", "--output", required=True, metavar="FILE.html")
    rep.set_defaults(func=cmd_report)

    dif = sub.add_parser("diff", help="two saved runs side by side: the headline table with "
                         "deltas of B against A")
    dif.add_argument("run_a", metavar="RUN_A", help="a `run --out` folder: the reference")
    dif.add_argument("run_b", metavar="RUN_B", help="another `run --out` folder")
    dif.add_argument("-o", "--output", metavar="FILE.html", help="also write the report of both")
    dif.set_defaults(func=cmd_diff)

    perf = sub.add_parser("perf", help="iteration-time models")
    psub = perf.add_subparsers(dest="perf_command", required=True, parser_class=Parser)
    imp = psub.add_parser("import", help="convert a published profile into a measured table")
    imp.add_argument("--from", dest="source", required=True, choices=("distserve", "splitwise", "vidur"))
    imp.add_argument("files", nargs="+", metavar="FILE")
    imp.add_argument("--model", required=True, help="catalog model the table is for")
    imp.add_argument("--gpu", required=True, help="catalog GPU the table is for")
    imp.add_argument("--tp", type=int, required=True, help="GPUs per instance")
    imp.add_argument("-o", "--out", required=True, metavar="TABLE.csv")
    imp.add_argument("--source-model", help="the model's name in the file (default: --model)")
    imp.add_argument("--source-gpu", help="the GPU's name in the file (splitwise; default: --gpu)")
    imp.add_argument("--commit", help="provenance: the source repository's commit")
    imp.add_argument("--licence", help="provenance: the source's licence")
    imp.set_defaults(func=cmd_perf_import)

    ctl = sub.add_parser("catalog", help="the GPUs, models and engine profiles known, with "
                         "where each comes from")
    ctl.add_argument("action", choices=("list", "show"))
    ctl.add_argument("what", nargs="?", help="list: gpus, models or engines (default: all); "
                     "show: an entry's name")
    _add_catalog_arg(ctl)
    ctl.set_defaults(func=cmd_catalog)

    cfs = sub.add_parser("configs", help="the bundled scenarios")
    cfs.add_argument("action", choices=("list",), help="list: each scenario's name (what a "
                     "command takes in place of a path), system and model")
    cfs.set_defaults(func=cmd_configs)

    val = sub.add_parser("validate", help="check a config (and that its model fits its GPUs)")
    _add_config_args(val, trace=False)
    val.set_defaults(func=cmd_validate)

    sub.add_parser("schema", help="print the config JSON Schema").set_defaults(func=cmd_schema)

    trace = sub.add_parser("trace", help="generate or inspect traces")
    tsub = trace.add_subparsers(dest="trace_command", required=True, parser_class=Parser)
    gen = tsub.add_parser("gen", help="write a synthetic Agent trace (knobs below)")
    gen.add_argument("--out", required=True, metavar="FILE")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--format", choices=("native", "mooncake"), default="native",
                     help="native keeps sessions for closed-loop replay; mooncake is open-loop")
    for name, f in AgentSpec.model_fields.items():
        gen.add_argument(f"--{name.replace('_', '-')}", dest=name, type=type(f.default),
                         help=f"{f.description} (default {f.default!r})")
    gen.set_defaults(func=cmd_trace_gen)

    stats = tsub.add_parser("stats", help="lengths, arrival rate and prefix-hit buckets of a trace")
    stats.add_argument("path")
    stats.add_argument("--format", default="auto",
                       choices=("auto", "mooncake", "azure", "native", "agent"))
    stats.add_argument("--lru-tokens", type=int, metavar="N", help="also under an LRU cache of N tokens")
    stats.add_argument("--window", type=float, metavar="S", help="time window for bucket shares")
    stats.add_argument("--shared-prefix", action="store_true",
                       help="agent traces: the system and tool prompt is shared by all sessions")
    stats.add_argument("--plot", metavar="FILE.png", help="stacked bucket shares over time")
    stats.add_argument("--json", action="store_true")
    stats.set_defaults(func=cmd_trace_stats)
    return top


def main(argv: list[str] | None = None) -> int:
    args = None
    try:
        COMMAND.set(shlex.join(["pddsim", *(sys.argv[1:] if argv is None else argv)]))
        args = parser().parse_args(argv)
        if getattr(args, "seed", None) is not None and args.seed < 0:
            raise InputError(f"--seed: must be at least 0, got {args.seed}")
        _catalog_overrides(args)
        return args.func(args)
    except InputError as e:
        print(f"pddsim: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:          # --help
        return int(e.code or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # an internal error: say what, not a wall of traceback (unless asked)
        if getattr(args, "debug", False):
            traceback.print_exc()
        else:
            print(f"pddsim: internal error: {type(e).__name__}: {e} (--debug shows the traceback)",
                  file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
