"""Timelines of every shipped scenario and of a grid of generated programs, as JSON files,
to check that a change to the core changes no result ("compare the JSON").

Usage::

    python benchmarks/timeline_digest.py OUTDIR          # write one JSON per case
    python benchmarks/timeline_digest.py OUTDIR --check REFDIR   # and compare to REFDIR
    ... --check REFDIR --only-old-fields   # ignore fields REFDIR's version did not write

Cases: each ``schedules/*.toml`` as shipped and under each semantics and comm stream; each
registered generator at two small sizes, lowered with each comm policy it accepts, under
``data``, ``eager`` and ``rendezvous``, with and without a per-rank comm stream, with
latency, finite bandwidth and a launch cost on some. A deadlock is recorded as its
message. Compares the JSON text exactly.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cases():
    from schedsim.scenario import load_scenario

    for f in sorted((ROOT / "schedules").glob("*.toml")):
        if f.name.startswith("replay"):
            continue
        sc = load_scenario(f)
        yield f.stem, f.stem, sc.build_program, sc.costs, sc.link, sc.comm
        for sem in ("data", "eager", "rendezvous"):
            for stream in ("none", "per-peer", "per-rank"):
                comm = sc.comm.model_copy(update={"semantics": sem, "comm_stream": stream})
                yield (f"{f.stem}-{sem}-{stream}", f.stem, sc.build_program, sc.costs,
                       sc.link, comm)
    from schedsim import CommModel, CostModel, LinkModel, build_program

    gens = [("gpipe", {}), ("1f1b", {}), ("dualpipe", {}), ("dualpipev", {}),
            ("interleaved-1f1b", {"chunks": 2}), ("interleaved-1f1b", {"chunks": 3}),
            ("interleaved-1f1b", {"chunks": 2, "variant": "megatron"}),
            ("looped-bfs", {"chunks": 2}), ("interleaved-zb", {"chunks": 2}),
            ("zb-h1", {}), ("zb-h2", {}), ("zbv", {}), ("zb-1p", {}), ("zb-2p", {})]
    sizes = [(4, 8), (3, 6)]
    costs = [CostModel(F=1, B=1, W=1, BW=2, FB=3), CostModel(F=1.5, B=1.25, W=0.75,
                                                            message_bytes=100)]
    links = [LinkModel(), LinkModel(latency=0.25, bandwidth=400)]
    for name, params in gens:
        for p, m in sizes:
            for policy in (None, "async", "commit", "torch"):
                def build(name=name, p=p, m=m, policy=policy, params=params):
                    return build_program(name, p, m, policy, **params)
                try:
                    build()
                except Exception as e:  # not valid at this size / policy
                    print(f"skip {name} {p}x{m} {policy}: {e}", file=sys.stderr)
                    continue
                pkey = f"{name}{params}-{p}x{m}-{policy}"
                for ci, c in enumerate(costs):
                    for li, lk in enumerate(links):
                        for sem in ("data", "eager", "rendezvous"):
                            for stream in ("none", "per-rank", "per-peer"):
                                lc = 0.1 if (ci + li) % 2 else 0.0
                                comm = CommModel(semantics=sem, comm_stream=stream,
                                                 launch_cost=lc if sem != "data" else 0.0)
                                tag = "-".join(f"{k}{v}" for k, v in params.items())
                                yield (f"{name}{tag}-{p}x{m}-{policy}-c{ci}-l{li}-{sem}-"
                                       f"{stream}", pkey, build, c, lk, comm)


def _trim(new, old):
    """``new`` restricted to the keys ``old`` has (recursively)."""
    if isinstance(new, dict) and isinstance(old, dict):
        return {k: _trim(new[k], old[k]) for k in old if k in new}
    if isinstance(new, list) and isinstance(old, list) and len(new) == len(old):
        return [_trim(a, b) for a, b in zip(new, old)]
    return new


def same(ref: str, text: str, only_old: bool) -> bool:
    if ref == text:
        return True
    if not only_old or not ref.startswith("{") or not text.startswith("{"):
        return False
    import json

    old, new = json.loads(ref), json.loads(text)
    for d in (old, new):
        if d.get("deadlock"):
            d["deadlock"]["message"] = ""
    return _trim(new, old) == old


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--check")
    ap.add_argument("--only-old-fields", action="store_true",
                    help="compare only the keys the reference files have, and deadlocks by "
                         "their cycle (not the wording of their message)")
    a = ap.parse_args()
    from schedsim import simulate
    from schedsim.errors import SchedsimError

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    progs = {}
    n = bad = 0
    for name, key, build, costs, link, comm in cases():
        if key not in progs:
            progs[key] = build()
        prog = progs[key]
        try:
            text = simulate(prog, costs, link, comm, raise_on_deadlock=False).to_json()
        except SchedsimError as e:
            text = f"error: {e}"
        (out / f"{name}.json").write_text(text)
        n += 1
        if a.check:
            ref = Path(a.check) / f"{name}.json"
            if not ref.exists() or not same(ref.read_text(), text, a.only_old_fields):
                bad += 1
                print(f"DIFFERS: {name}")
    digest = hashlib.sha256(b"".join((out / f).read_bytes() for f in
                                     sorted(p.name for p in out.glob("*.json")))).hexdigest()
    print(f"{n} timelines, sha256 {digest[:16]}" + (f", {bad} differ" if a.check else ""))
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
