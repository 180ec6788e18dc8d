"""Where users wait (issue 26): this tree against a baseline checkout, side by side.

Each figure is measured for both trees in one run, interleaved (tree A, tree B, tree A,
...), every measurement in a fresh process; medians over the repeats, and the ratio of the
two medians, which is what to read on a shared machine (the load average at the start and
the end is printed). Wall seconds, CPU seconds (user + system of the child) and the
child's peak RSS come from ``os.wait4``.

Figures:

- ``startup``: ``schedsim --help`` and a small ``simulate`` (1f1b, 4 x 8, ``-q``), and
  the floor of the libraries the CLI is built on (:data:`_LIBRARY_FLOOR`: importing
  numpy, typer with its pydantic adapters and rich's console, and validating one pydantic
  model, in the same interpreter: no schedsim code; the same in both trees);
- ``planners``: each zero-bubble / V planner at 64 x 256 against lowering + simulating its
  own output, in one process (the ratio is the figure), plus a hash of every order (the
  two trees must generate the same schedules);
- ``compare``: ``schedsim compare -p 64 -m 256`` against one ``schedsim simulate -s 1f1b
  -p 64 -m 256 -q``;
- ``10m``: ``schedsim simulate -s 1f1b -p 128 -m 10000 --semantics rendezvous -q`` (10 M
  instructions): wall, CPU and peak RSS.

Usage::

    git worktree add --detach /tmp/base ff5555c
    python benchmarks/bench_wait.py --baseline /tmp/base [--repeats 5] [--only startup,10m]

Modules are read from bytecode caches (``PYTHONPYCACHEPREFIX`` in a temporary folder,
warmed by one unmeasured run of each command), as an installed schedsim is.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PLANNERS = ("zb-1p", "zb-2p", "zbv", "v-half", "v-min")

#: run in each tree: every planner at 64 x 256, planning time against lowering +
#: simulating the planned schedule (in this process), and a hash of its order
_PLANNER_PROBE = r"""
import hashlib, json, sys, time
from schedsim import CommModel, CostModel, generate, lower, simulate
from schedsim.sim.simulate import warm_up
warm_up()
p, m = int(sys.argv[1]), int(sys.argv[2])
costs, comm = CostModel(F=1, B=1, W=1), CommModel(semantics="data")
out = {}
for name in sys.argv[3].split(","):
    t = time.perf_counter()
    s = generate(name, p, m)
    t_plan = time.perf_counter() - t
    t = time.perf_counter()
    simulate(lower(s), costs, comm=comm)
    t_sim = time.perf_counter() - t
    rows = [[(o.kind, o.stage, o.mb) for o in r] for r in s.ranks]
    out[name] = {"plan": t_plan, "sim": t_sim,
                 "hash": hashlib.sha256(repr(rows).encode()).hexdigest()[:16]}
print("RESULT " + json.dumps(out))
"""


#: what any start-up of the CLI pays before schedsim's own code: the interpreter with its
#: site (the editable install's path finder included), numpy, typer (which imports
#: pydantic for its parameters), rich's console, and a pydantic model's first build and
#: validation (pydantic's plugin scan)
_LIBRARY_FLOOR = r"""
import numpy, typer, typer.main, typer._adapters, pydantic, rich.console
class Probe(pydantic.BaseModel):
    x: int = 1
Probe(x=2)
"""


def run_child(cmd: list[str], tree: Path, env: dict[str, str]) -> dict:
    """Run ``cmd`` with ``tree`` first on the path: wall, CPU, peak RSS and stdout."""
    e = dict(env, PYTHONPATH=str(tree))
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed in {tree} (exit {proc.returncode})")
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "rss_mb": ru.ru_maxrss / 1024,
            "out": out}


def interleaved(cmds: dict[str, list[str]], trees: dict[str, Path], repeats: int,
                env: dict[str, str]) -> dict[tuple[str, str], list[dict]]:
    """Every command in every tree, ``repeats`` rounds, trees alternating within a round
    (one warm-up run each first, not counted)."""
    for cmd in cmds.values():
        for tree in trees.values():
            run_child(cmd, tree, env)
    res: dict[tuple[str, str], list[dict]] = {}
    for rnd in range(repeats):
        order = list(trees.items())
        if rnd % 2:
            order.reverse()
        for name, cmd in cmds.items():
            for label, tree in order:
                res.setdefault((name, label), []).append(run_child(cmd, tree, env))
    return res


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def report_commands(title: str, res: dict, labels: list[str]) -> None:
    print(f"\n## {title}")
    print(f"{'command':58} {'tree':9} {'wall s':>8} {'cpu s':>8} {'peak MB':>8}")
    names = sorted({k[0] for k in res}, key=list(dict.fromkeys(k[0] for k in res)).index)
    for name in names:
        for label in labels:
            rows = res[(name, label)]
            print(f"{name[:58]:58} {label:9} {med(rows, 'wall'):8.3f} {med(rows, 'cpu'):8.3f} "
                  f"{med(rows, 'rss_mb'):8.0f}")
        a, b = (res[(name, lb)] for lb in labels)
        print(f"{'':58} {'ratio':9} {med(b, 'wall') / med(a, 'wall'):8.2f} "
              f"{med(b, 'cpu') / med(a, 'cpu'):8.2f} {med(b, 'rss_mb') / med(a, 'rss_mb'):8.2f}")


def planners(trees: dict[str, Path], repeats: int, env: dict[str, str]) -> None:
    cmd = [sys.executable, "-c", _PLANNER_PROBE, "64", "256", ",".join(PLANNERS)]
    res = interleaved({"planners": cmd}, trees, repeats, env)
    print("\n## planners at 64 x 256: planning / (lowering + simulating its output), "
          "one process")
    print(f"{'planner':8} " + " ".join(f"{lb + ' plan s':>14} {lb + ' x sim':>12}"
                                       for lb in trees))
    hashes = {}
    for name in PLANNERS:
        cells = []
        for label in trees:
            runs = [json.loads(r["out"].split("RESULT ", 1)[1])[name]
                    for r in res[("planners", label)]]
            plan = statistics.median(x["plan"] for x in runs)
            ratio = statistics.median(x["plan"] / x["sim"] for x in runs)
            hashes.setdefault(name, set()).update(x["hash"] for x in runs)
            cells.append(f"{plan:14.3f} {ratio:12.2f}")
        print(f"{name:8} " + " ".join(cells))
    same = all(len(h) == 1 for h in hashes.values())
    print(f"orders identical in both trees: {'yes' if same else 'NO: ' + str(hashes)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True,
                    help="a checkout of the baseline (e.g. a git worktree of main)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", default="startup,planners,compare,10m",
                    help="comma-separated: startup, planners, compare, 10m")
    args = ap.parse_args()
    trees = {"baseline": args.baseline.resolve(), "this": ROOT}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="schedsim-bench-pyc-")
    exe = [sys.executable, "-m", "schedsim"]
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs); "
          f"{args.repeats} repeats, medians")
    only = set(args.only.split(","))
    labels = list(trees)
    if "startup" in only:
        report_commands("start-up", interleaved({
            "schedsim --help": exe + ["--help"],
            "schedsim simulate -s 1f1b -p 4 -m 8 -q": exe + ["simulate", "-s", "1f1b", "-p",
                                                           "4", "-m", "8", "-q"],
            "libraries only (numpy, typer, pydantic, rich)": [sys.executable, "-c",
                                                              _LIBRARY_FLOOR]},
            trees, args.repeats, env), labels)
    if "planners" in only:
        planners(trees, args.repeats, env)
    if "compare" in only:
        res = interleaved({
            "schedsim compare -p 64 -m 256": exe + ["compare", "-p", "64", "-m", "256"],
            "schedsim simulate -s 1f1b -p 64 -m 256 -q": exe + [
                "simulate", "-s", "1f1b", "-p", "64", "-m", "256", "-q"]},
            trees, max(1, args.repeats // 2), env)
        report_commands("compare, every schedule, 64 x 256", res, labels)
        for label in labels:
            c = med(res[("schedsim compare -p 64 -m 256", label)], "wall")
            s = med(res[("schedsim simulate -s 1f1b -p 64 -m 256 -q", label)], "wall")
            print(f"{label}: compare / simulate (wall) = {c / s:.2f}")
    if "10m" in only:
        report_commands("10 M instructions", interleaved({
            "schedsim simulate -s 1f1b -p 128 -m 10000 --semantics rendezvous -q": exe + [
                "simulate", "-s", "1f1b", "-p", "128", "-m", "10000", "--semantics",
                "rendezvous", "-q"]}, trees, max(1, args.repeats // 2), env), labels)
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
