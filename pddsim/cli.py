"""Command line: `pddsim run | validate | schema | trace gen | trace stats`.

Bad input ends with one line on stderr and exit status 2; an internal error with exit status 1.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from pddsim.errors import InputError

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "same_dc_pd.yaml"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2 like any other bad input."""

    def error(self, message):
        raise InputError(f"{self.prog}: {message}")


def _json(obj) -> str:
    return json.dumps(obj, indent=2, allow_nan=True, default=float)


def _progress(total: int, quiet: bool):
    from tqdm import tqdm
    return tqdm(total=total, unit="req", file=sys.stderr, delay=2.0, mininterval=0.5,
                disable=quiet or not sys.stderr.isatty())


def _config(args):
    from pddsim.config import load_config
    overrides = list(args.set or [])
    if getattr(args, "trace", None):
        overrides += [f"workload.trace={Path(args.trace).resolve()}", "workload.synthetic=null"]
    return load_config(args.config or DEFAULT_CONFIG, overrides)


def cmd_run(args) -> int:
    from pddsim.metrics import by_bucket
    from pddsim.sim import load_workload, simulate
    cfg = _config(args)
    workload = load_workload(cfg)
    with _progress(len(workload), args.quiet) as bar:
        result = simulate(cfg, workload, args.seed, on_progress=bar.update)
    if args.out:
        result.write(args.out)
    if args.json:
        print(_json(result.summary))
    else:
        width = max(map(len, result.summary))
        for key, value in result.summary.items():
            shown = f"{value:.6g}" if isinstance(value, float) else value
            print(f"{key:<{width}}  {shown}")
    if args.by_bucket:
        print(by_bucket(result.requests).to_string(float_format=lambda v: f"{v:.3f}"),
              file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_validate(args) -> int:
    from pddsim.deployment import check
    cfg = _config(args)
    check(cfg)
    print(f"{args.config}: ok ({cfg.name})")
    return 0


def cmd_schema(args) -> int:
    from pddsim.config import schema
    print(_json(schema()))
    return 0


def cmd_trace_gen(args) -> int:
    from pddsim import synthetic
    from pddsim.workload import write_mooncake, write_native
    knobs = {f.name: getattr(args, f.name) for f in dataclasses.fields(synthetic.AgentSpec)
             if getattr(args, f.name) is not None}
    workload = synthetic.agent_workload(synthetic.AgentSpec(**knobs), seed=args.seed)
    (write_native if args.format == "native" else write_mooncake)(workload, args.out)
    print(f"{args.out}: {len(workload)} requests, {workload.sessions} sessions", file=sys.stderr)
    return 0


def cmd_trace_stats(args) -> int:
    from pddsim.trace_stats import format_stats, plot_bucket_shares, trace_stats
    from pddsim.workload import read_workload
    workload = read_workload(args.path, args.format, shared_prefix=args.shared_prefix)
    stats = trace_stats(workload, lru_capacity_tokens=args.lru_tokens, window_s=args.window)
    if args.plot:
        plot_bucket_shares(workload, args.plot, window_s=args.window,
                           lru_capacity_tokens=args.lru_tokens)
    print(_json(stats) if args.json else format_stats(stats))
    return 0


def _add_config_args(p, *, trace=True):
    p.add_argument("config", nargs="?", help=f"scenario YAML (default: {DEFAULT_CONFIG.name})")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config field by dotted path, e.g. wan.bandwidth_gbps=20")
    if trace:
        p.add_argument("--trace", metavar="PATH", help="replay this trace instead of the config's")


def parser() -> Parser:
    from pddsim.synthetic import AgentSpec
    top = Parser(prog="pddsim", description="Simulate cross-datacenter PD / PDD LLM serving.")
    sub = top.add_subparsers(dest="command", required=True, parser_class=Parser)

    run = sub.add_parser("run", help="simulate one scenario and print its summary")
    _add_config_args(run)
    run.add_argument("--seed", type=int, help="override the config's seed")
    run.add_argument("--out", metavar="DIR", help="write requests.parquet and summary.json here")
    run.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--by-bucket", action="store_true", help="TTFT per prefix-hit-rate bucket")
    run.set_defaults(func=cmd_run)

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
    for f in dataclasses.fields(AgentSpec):
        gen.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=_knob_type(f.type),
                         help=f"{f.metadata['help']} (default {f.default})")
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


def _knob_type(name: str):
    return {"int": int, "float": float, "str": str}[name]


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        return args.func(args)
    except InputError as e:
        print(f"pddsim: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # an internal error: say what, not a wall of traceback
        print(f"pddsim: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
