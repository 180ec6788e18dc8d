"""Fuzzing every loader through the CLI: scenario TOML, program text, torch CSV, schedule
JSON, timeline JSON, cost file and Kineto trace, each from valid seeds mutated at the
byte, token and structure level (hostile numbers, deep nesting, markup, NUL bytes, huge
fields, unknown keys, missing keys). Every case must end with exit 0, 2 (one ``error:``
line, no traceback) or 3 (deadlock), within a time limit: never a traceback, never a hang.

The cases run in-process (``typer.testing.CliRunner``) under small work limits
(``--max instructions=...``, :mod:`schedsim.util.limits`), so a mutated size is refused
up front instead of merely running long. In CI hypothesis draws the mutations
(:data:`EXAMPLES` per loader, about 30 s in all on a shared 2-core machine); the campaign
outside CI runs many more with seeded random mutations and prints the counts::

    python tests/test_fuzz_loaders.py --cases 6000      # ~ 6000 cases over 7 loaders
"""
from __future__ import annotations

import json
import os
import random
import re
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import ROOT, SCHEDULES  # noqa: E402

from schedsim.cli import app  # noqa: E402

KINDS = ("toml", "program", "csv", "schedule_json", "timeline", "costs", "trace")
#: work limits of every fuzz case (a mutated size above them is refused up front)
LIMITS = ["--max", "instructions=200000", "--max", "ranks=64", "--max", "file_mb=4"]
#: seconds a case may take before it counts as a hang (a shared 2-core machine)
CASE_TIMEOUT_S = 30.0
#: hypothesis examples per loader in CI; SCHEDSIM_FUZZ_EXAMPLES raises it
EXAMPLES = int(os.environ.get("SCHEDSIM_FUZZ_EXAMPLES", "40"))

NASTY_TEXT = ["\x00", "\ufeff", "\u202e", "\r\n", "[/]", "[bold]", "$\\frac{$", ":x:",
              "nan", "inf", "-inf", "-1", "1e308", "1e400", "0", "999999999", "4294967296",
              "9" * 40, "9" * 5000, "[" * 3000, "{" * 3000, "(" * 3000, "A" * 200_000,
              "\\", '"', "'", "#", "=", ",", "\n", "é", "\udcff"]
NASTY_NUMBERS = ["0", "-1", "-0", "1", "2", "7", "999999999", "4096", "65536", "1e9", "1e308",
                 "1e400", "nan", "inf", "-inf", "0.0000001", "12345678901234567890",
                 "9" * 5000, "0x10", "1_000"]
NASTY_TOKENS = ["999999999F0", "0F999999999", "0F" + "9" * 12, "BATCH[]", "WAIT[]",
                "WAIT[0SEND_F0+0SEND_F0]", "BATCH[0SEND_F0+0RECV_B0]", "COMMIT", "0FB0",
                "0SEND_X0", "(0F0;1BW0)", "(0F0;1BW0)OVERLAP_F_B", "(" * 3000 + "0F0",
                "(0F0;(1F0;2B0))OVERLAP_F_B", "rank 9:", "[/]", "$\\frac{$", ":x:", "5W3",
                "0RECV_F0", "1SEND_B0", "3BW2", "0I0", "0B0", "0UNSHARD", "0F0junk", "-1F0"]
NASTY_JSON = [None, -1, 0, 1, 2 ** 31, 10 ** 30, 1e308, float("nan"), float("inf"),
              -float("inf"), "", "[/]", "$\\frac{$", ":x:", "x" * 100_000, [], {}, True,
              [[[[[]]]]], {"bogus": 1}, 1e12, -1e-9, "0F0", "nan", "X", "schedsim:0F0",
              "schedsim:999999999F0", "schedsim:BATCH[0SEND_F0+1RECV_B0]", "PP:1I0",
              "PP:(0F0;1I0)OVERLAP_F_B", "PP:" + "(" * 100 + "0F0", "Forward 99999999",
              "schedsim:WAIT[" + "+".join(f"0SEND_F{i}" for i in range(300)) + "]"]


# -- seeds -----------------------------------------------------------------------------
def _cli(*args: str) -> None:
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code in (0, 3), r.output


def _trace_events(tl: dict, rank: int) -> dict:
    """A Kineto-style trace of ``rank`` from a simulated timeline's JSON (schedsim:<token>
    ranges in µs: the spans)."""
    ev = []
    for s in tl["spans"]:
        if s["rank"] != rank:
            continue
        if s["parts"]:
            a, b = s["parts"]
            name = f"schedsim:({a['stage']}F{a['mb']};{b['stage']}{b['kind']}{b['mb']})"
        else:
            name = f"schedsim:{s['stage']}{s['kind']}{s['mb']}"
        ev.append({"ph": "X", "name": name, "ts": 1000 * s["start"],
                   "dur": 1000 * (s["end"] - s["start"]), "pid": rank, "tid": 1})
    ev.append({"ph": "M", "name": "process_name", "pid": rank})
    return {"traceEvents": ev, "distributedInfo": {"rank": rank, "world_size": tl["ranks"]},
            "baseTimeNanoseconds": 1_700_000_000_000_000_000}


def make_seeds(d: Path) -> dict[str, list[tuple[str, bytes]]]:
    """Valid seed files of every kind: ``{kind: [(file name, bytes)]}`` (built with the
    CLI in folder ``d``; the TOML seeds' side files are copied there too)."""
    d.mkdir(parents=True, exist_ok=True)
    seeds: dict[str, list[tuple[str, bytes]]] = {k: [] for k in KINDS}
    for f in sorted(SCHEDULES.glob("*.toml")):
        seeds["toml"].append((f.name, f.read_bytes()))
    for f in sorted(SCHEDULES.glob("*.txt")):          # the TOML seeds' program files
        (d / f.name).write_bytes(f.read_bytes())
    seeds["toml"].append(("full.toml", b"""title = "all tables"
[schedule]
name = "zbv"
ranks = 2
microbatches = 4
[costs]
F = 1.5
B = 1
W = 0.5
message_bytes = 100
[costs.stage.1]
F = 2
[[costs.overrides]]
stage = 0
mb = 1
kind = "B"
cost = 3
[costs.stage_bytes]
0 = 50
[link]
latency = 0.25
bandwidth = 1000
[[link.links]]
src = 0
dst = 1
latency = 1
[comm]
semantics = "rendezvous"
comm_stream = "per-peer"
launch_cost = 0.1
[memory]
model = "inflight"
F = 2
"""))
    for name, args in [("1f1b.txt", ["1f1b", "-p", "2", "-m", "4"]),
                       ("dualpipe.txt", ["dualpipe", "-p", "4", "-m", "8"]),
                       ("zbv-torch.txt", ["zbv", "-p", "2", "-m", "4", "--comm-policy",
                                          "torch"]),
                       ("il-commit.txt", ["interleaved-1f1b", "-p", "2", "-m", "4",
                                          "--chunks", "2", "--comm-policy", "commit"])]:
        _cli("generate", *args, "-o", d / name)
        seeds["program"].append((name, (d / name).read_bytes()))
    seeds["program"].append(("crossed.txt", (SCHEDULES / "crossed-sends.txt").read_bytes()))
    for name, fmt, args in [("zb.csv", "torch-csv", ["zb-h1", "-p", "2", "-m", "4"]),
                            ("il.csv", "torch-csv", ["interleaved-1f1b", "-p", "2", "-m",
                                                     "4"]),
                            ("comms.csv", "torch-csv-comms", ["1f1b", "-p", "2", "-m", "4"]),
                            ("v.csv", "torch-csv", ["dualpipev", "-p", "2", "-m", "4"])]:
        _cli("generate", *args, "-f", fmt, "-o", d / name)
        seeds["csv"].append((name, (d / name).read_bytes()))
    for name, fmt, args in [("s.json", "json", ["1f1b", "-p", "2", "-m", "4"]),
                            ("p.json", "program-json", ["dualpipe", "-p", "2", "-m", "4"])]:
        _cli("generate", *args, "-f", fmt, "-o", d / name)
        seeds["schedule_json"].append((name, (d / name).read_bytes()))
    seeds["schedule_json"].append(
        ("zb.json", (SCHEDULES / "handwritten-zb-2x4.json").read_bytes()))
    _cli("simulate", "-s", "zbv", "-p", "2", "-m", "4", "--semantics", "rendezvous",
         "--message-bytes", "10", "--bandwidth", "100", "-q", "--json", d / "tl.json")
    _cli("simulate", SCHEDULES / "crossed-sends.toml", "--semantics", "rendezvous", "-q",
         "--json", d / "dead.json")
    _cli("simulate", "-s", "dualpipe", "-p", "2", "-m", "4", "-q", "--json", d / "dp.json")
    for name in ("tl.json", "dead.json", "dp.json"):
        seeds["timeline"].append((name, (d / name).read_bytes()))
    seeds["timeline"].append(
        ("m.json", (ROOT / "docs/img/replay/1f1b-measured.json").read_bytes()))
    seeds["costs"].append(("c.toml", (ROOT / "docs/img/replay/1f1b-costs.toml").read_bytes()))
    seeds["costs"].append(("all.toml", b"[costs]\nunit = \"ms\"\nF = 1.25\nB = 2\nW = 1\n"
                                       b"message_bytes = 1024\n[costs.stage.1]\nF = 2\nBW = 3\n"
                                       b"[link]\nlatency = 0.01\nbandwidth = 1e6\n"
                                       b"[comm]\nlaunch_cost = 0.02\n"))
    tl = json.loads((d / "dp.json").read_text())
    for r in range(2):
        seeds["trace"].append((f"rank{r}.json", json.dumps(_trace_events(tl, r)).encode()))
    return seeds


#: seeds that need a placement flag
PLACEMENTS = {"dualpipe.txt": "dual", "zbv-torch.txt": "v", "v.csv": "v"}


def command(kind: str, path: Path, work: Path) -> list[str]:
    """The CLI call that loads a file of ``kind``."""
    pl = ["--placement", PLACEMENTS[path.name]] if path.name in PLACEMENTS else []
    if kind == "toml":
        return ["simulate", str(path), "-q", "--json", str(work / "out.json")]
    if kind == "program":
        return ["simulate", "--program", str(path), "-q", "--semantics", "rendezvous", *pl]
    if kind in ("csv", "schedule_json"):
        return ["simulate", "--schedule-file", str(path), "-q", "--semantics", "eager", *pl]
    if kind == "timeline":       # the analyses behind the flags read every record
        return ["render", str(path), "-o", str(work / "out.svg"), "--arrows", "--memory",
                "--stalls"]
    if kind == "costs":
        return ["simulate", "-s", "1f1b", "-p", "2", "-m", "4", "-q", "--semantics", "eager",
                "--costs-file", str(path)]
    if kind == "trace":
        return ["import-trace", str(path), str(work / "other-rank.json"), "--json",
                str(work / "out.json")]
    raise ValueError(kind)


# -- mutations -------------------------------------------------------------------------
def _flip(rng: random.Random, data: bytes, kind: str) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if b:
            b[rng.randrange(len(b))] = rng.choice([0, 0xFF, 0x80, 0x22, 0x5B, 0x0A,
                                                   rng.randrange(256)])
    return bytes(b)


def _insert(rng: random.Random, data: bytes, kind: str) -> bytes:
    i = rng.randint(0, len(data))
    snippet = rng.choice(NASTY_TEXT).encode("utf-8", "surrogatepass")
    return data[:i] + snippet + data[i:]


def _delete(rng: random.Random, data: bytes, kind: str) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    return data[:i] + data[i + rng.randint(1, max(1, len(data) // 4)):]


def _duplicate(rng: random.Random, data: bytes, kind: str) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    j = min(len(data), i + rng.randint(1, 200))
    return data[:j] + data[i:j] * rng.choice([1, 2, 10, 1000]) + data[j:]


def _truncate(rng: random.Random, data: bytes, kind: str) -> bytes:
    return data[:rng.randint(0, len(data))]


def _number(rng: random.Random, data: bytes, kind: str) -> bytes:
    text = data.decode("utf-8", "replace")
    nums = list(re.finditer(r"\d+(?:\.\d+)?", text))
    if not nums:
        return _insert(rng, data, kind)
    m = rng.choice(nums)
    text = text[:m.start()] + rng.choice(NASTY_NUMBERS) + text[m.end():]
    return text.encode()


def _token(rng: random.Random, data: bytes, kind: str) -> bytes:
    """Program / CSV: replace, delete, duplicate or move a token (cell)."""
    sep = "," if kind == "csv" else " "
    lines = data.decode("utf-8", "replace").split("\n")
    lines = [ln for ln in lines if ln.strip()] or [""]
    r = rng.randrange(len(lines))
    toks = lines[r].split(sep)
    i = rng.randrange(len(toks))
    op = rng.randrange(5)
    if op == 0:
        toks[i] = rng.choice(NASTY_TOKENS)
    elif op == 1:
        del toks[i]
    elif op == 2:
        toks.insert(i, toks[i])
    elif op == 3:
        j = rng.randrange(len(toks))
        toks[i], toks[j] = toks[j], toks[i]
    else:
        other = rng.randrange(len(lines))
        if other != r:
            lines[other] += sep + toks.pop(i) if toks else ""
    lines[r] = sep.join(toks)
    if rng.random() < 0.1:
        lines.append(rng.choice(lines))          # an extra rank line
    return "\n".join(lines).encode() + b"\n"


def _paths(obj, path=()):
    yield path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:50]):
            yield from _paths(v, path + (i,))


def _json(rng: random.Random, data: bytes, kind: str) -> bytes:
    """JSON: set a value anywhere to a hostile one, add an unknown key, drop a key, or
    nest deeply."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return _insert(rng, data, kind)
    paths = [p for p in _paths(obj) if p]
    if not paths:
        return _insert(rng, data, kind)
    p = rng.choice(paths)
    parent = obj
    for k in p[:-1]:
        parent = parent[k]
    op = rng.randrange(5)
    if op <= 1:
        parent[p[-1]] = rng.choice(NASTY_JSON)
    elif op == 2 and isinstance(parent, dict):
        parent[rng.choice(["bogus", "extra", "ranks", "kind", "schedule"])] = \
            rng.choice(NASTY_JSON)
    elif op == 3 and isinstance(parent, dict):
        del parent[p[-1]]
    elif op == 3:
        parent.pop(p[-1])
    else:
        v = parent[p[-1]]
        for _ in range(rng.choice([10, 1000, 20_000])):
            v = [v]
        parent[p[-1]] = v
    try:
        return json.dumps(obj).encode()
    except (ValueError, RecursionError):
        return data


def _toml(rng: random.Random, data: bytes, kind: str) -> bytes:
    """TOML: replace a value, add a key or a table, drop a line, nest deeply."""
    lines = data.decode("utf-8", "replace").split("\n")
    kv = [i for i, ln in enumerate(lines) if re.match(r"\s*[\w.\"-]+\s*=", ln)]
    op = rng.randrange(5)
    values = ["nan", "inf", "-inf", "-1", "-100", "0", "1e308", "9" * 30, "9" * 5000,
              '"[/]"', '"$\\\\frac{$"', '":x:"', "true", "[1, 2]", "{a = 1}", '""',
              "99999999", '"/dev/zero"', '"/etc/passwd"', '"a\\u0000b"', "2e9",
              "[" * 3000 + "]" * 3000]
    if op <= 1 and kv:
        i = rng.choice(kv)
        key = lines[i].split("=", 1)[0]
        lines[i] = f"{key}= {rng.choice(values)}"
    elif op == 2:
        lines.insert(rng.randint(0, len(lines)), rng.choice(
            ["bogus = 1", "[bogus]", "[costs.stage.99999999]", "F = nan", "[[link.links]]",
             "src = 0", "[memory]", "[replay]", "[costs.stage_bytes]", "0 = -100",
             "ranks = 9999", "microbatches = 99999999", "chunks = 999999999",
             "[schedule]", 'program = "/proc/self/environ"', 'schedule_file = "x.csv"']))
    elif op == 3 and lines:
        del lines[rng.randrange(len(lines))]
    else:
        return _insert(rng, data, kind)
    return "\n".join(lines).encode()


MUTATIONS: dict[str, Callable[[random.Random, bytes, str], bytes]] = {
    "flip": _flip, "insert": _insert, "delete": _delete, "duplicate": _duplicate,
    "truncate": _truncate, "number": _number, "token": _token, "json": _json,
    "toml": _toml,
}
#: mutations that fit each kind (the byte-level ones fit every kind)
FITS = {
    "toml": ["toml", "toml", "number", "insert", "flip", "delete", "duplicate"],
    "costs": ["toml", "toml", "number", "insert", "flip", "delete", "truncate"],
    "program": ["token", "token", "number", "insert", "flip", "delete", "duplicate"],
    "csv": ["token", "token", "number", "insert", "flip", "delete", "duplicate"],
    "schedule_json": ["json", "json", "number", "insert", "flip", "truncate"],
    "timeline": ["json", "json", "json", "number", "insert", "flip", "truncate"],
    "trace": ["json", "json", "number", "insert", "flip", "truncate"],
}


def mutate(kind: str, data: bytes, ops: list[tuple[str, int]]) -> bytes:
    for name, seed in ops:
        data = MUTATIONS[name](random.Random(seed), data, kind)
    return data


# -- one case --------------------------------------------------------------------------
class _Hang(BaseException):
    """A case ran past CASE_TIMEOUT_S (a BaseException: no handler of the CLI eats it)."""


def _alarm(signum, frame):
    raise _Hang()


def run_case(kind: str, name: str, data: bytes, work: Path,
             other: bytes | None = None) -> tuple[str, str]:
    """Run the loader of ``kind`` on ``data`` (written to ``work/name``). Returns
    ``(outcome, detail)``: outcome ``ok`` (exit 0), ``bad-input`` (exit 2, one error
    line), ``deadlock`` (exit 3), or a failure: ``traceback``, ``hang``, ``bad-exit``
    (another code), ``not-one-line`` (an error of several lines or over 1,000 chars)."""
    path = work / name
    path.write_bytes(data)
    if kind == "trace":
        (work / "other-rank.json").write_bytes(other or b"{}")
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, CASE_TIMEOUT_S)
    try:
        r = CliRunner().invoke(app, command(kind, path, work) + LIMITS)
    except _Hang:
        return "hang", f"{kind} {name}: over {CASE_TIMEOUT_S:g} s"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    err = r.stderr.strip()
    if isinstance(r.exception, _Hang):
        return "hang", f"{kind} {name}: over {CASE_TIMEOUT_S:g} s"
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        import traceback

        tb = "".join(traceback.format_exception(r.exception)[-3:])
        return "traceback", f"{kind} {name}: {tb}"
    if "Traceback" in r.output:
        return "traceback", f"{kind} {name}: {r.output[-800:]}"
    if r.exit_code == 0:
        return "ok", ""
    if r.exit_code not in (2, 3):
        return "bad-exit", f"{kind} {name}: exit {r.exit_code}: {err[-300:]}"
    if r.exit_code == 2 and (len(err.splitlines()) != 1 or len(err) > 1000
                             or not err.startswith("error:")):
        return "not-one-line", f"{kind} {name}: {err[:600]}"
    return ("bad-input" if r.exit_code == 2 else "deadlock"), err


# -- CI: hypothesis over the mutations -------------------------------------------------
@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    d = tmp_path_factory.mktemp("seeds")
    return make_seeds(d), d


def _ops(kind: str):
    return st.lists(st.tuples(st.sampled_from(FITS[kind]), st.integers(0, 2 ** 32)),
                    min_size=1, max_size=3)


@pytest.mark.parametrize("kind", KINDS)
def test_fuzz_loader(kind, seeds, tmp_path_factory) -> None:
    """A loader on mutated seeds: exit 0, 2 (one line) or 3; no traceback, no hang."""
    all_seeds, d = seeds
    work = tmp_path_factory.mktemp(f"fuzz-{kind}")
    for f in d.iterdir():
        if f.suffix == ".txt":
            (work / f.name).write_bytes(f.read_bytes())
    pool = all_seeds[kind]

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(i=st.integers(0, len(pool) - 1), ops=_ops(kind))
    def case(i, ops):
        name, data = pool[i]
        other = pool[1 - i][1] if kind == "trace" else None
        outcome, detail = run_case(kind, name, mutate(kind, data, ops), work, other)
        assert outcome in ("ok", "bad-input", "deadlock"), (outcome, ops, detail)

    case()


def test_seeds_load(seeds, tmp_path_factory) -> None:
    """The unmutated seeds load (exit 0, or 3 for the deadlocking ones; 2 for a scenario
    that says so, ``# expected: exit 2``: a shipped case of a refused program)."""
    all_seeds, d = seeds
    work = tmp_path_factory.mktemp("seeds-ok")
    for f in d.iterdir():
        if f.suffix == ".txt":
            (work / f.name).write_bytes(f.read_bytes())
    for kind, pool in all_seeds.items():
        for i, (name, data) in enumerate(pool):
            other = pool[1 - i][1] if kind == "trace" else None
            outcome, detail = run_case(kind, name, data, work, other)
            ok = ("bad-input",) if b"# expected: exit 2" in data else ("ok", "deadlock")
            assert outcome in ok, (kind, name, outcome, detail)


# -- the campaign (outside CI) ---------------------------------------------------------
def campaign(cases: int, seed: int = 0, out: Path | None = None) -> Counter:
    """``cases`` fuzz cases spread over the loaders with seeded random mutations; prints
    the counts per loader and outcome and the first failures. Returns the counts."""
    import tempfile

    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix="schedsim-fuzz-"))
    all_seeds = make_seeds(root / "seeds")
    work = root / "work"
    work.mkdir()
    for f in (root / "seeds").iterdir():
        if f.suffix == ".txt":
            (work / f.name).write_bytes(f.read_bytes())
    counts: Counter = Counter()
    failures: list[str] = []
    t0 = time.time()
    slowest = (0.0, "")
    for n in range(cases):
        kind = KINDS[n % len(KINDS)]
        pool = all_seeds[kind]
        i = rng.randrange(len(pool))
        name, data = pool[i]
        ops = [(rng.choice(FITS[kind]), rng.randrange(2 ** 32))
               for _ in range(rng.randint(1, 3))]
        t = time.time()
        outcome, detail = run_case(kind, name, mutate(kind, data, ops), work,
                                   pool[1 - i][1] if kind == "trace" else None)
        if time.time() - t > slowest[0]:
            slowest = (time.time() - t, f"{kind} {ops}")
        counts[(kind, outcome)] += 1
        if outcome not in ("ok", "bad-input", "deadlock"):
            failures.append(f"{outcome}: {ops}: {detail}")
        if (n + 1) % 500 == 0:
            print(f"{n + 1} cases, {time.time() - t0:.0f} s, failures {len(failures)}",
                  flush=True)
    lines = [f"{cases} cases in {time.time() - t0:.0f} s (seed {seed}), slowest case "
             f"{slowest[0]:.1f} s ({slowest[1]})"]
    for kind in KINDS:
        row = {o: counts[(kind, o)] for o in ("ok", "bad-input", "deadlock", "traceback",
                                              "hang", "bad-exit", "not-one-line")}
        lines.append(f"{kind:14s} " + "  ".join(f"{o} {v}" for o, v in row.items()))
    lines += failures[:30]
    text = "\n".join(lines)
    print(text)
    if out is not None:
        out.write_text(text + "\n")
    return counts


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=6000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    c = campaign(a.cases, a.seed, a.out)
    bad = sum(v for (_, o), v in c.items() if o not in ("ok", "bad-input", "deadlock"))
    sys.exit(1 if bad else 0)
