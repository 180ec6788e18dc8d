"""``python -m schedsim.replay``: one rank of a replay.

- ``python -m schedsim.replay --spec FILE``: a rank started by ``schedsim replay --nproc``
  (see :mod:`schedsim.replay.launch`);
- ``torchrun --nnodes N --nproc-per-node G -m schedsim.replay SCENARIO [--json FILE]
  [--check-grads] [--backend gloo|nccl] [--timeout S] [--profile-dir DIR]``: multi-node;
  torchrun starts the ranks, rank 0 writes the measured Timeline JSON and prints the
  makespan (and the gradient check). Exit 1 if this rank failed or the check failed.
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m schedsim.replay",
                                 description="Run one rank of a schedsim replay.")
    ap.add_argument("scenario", nargs="?", help="scenario TOML (torchrun mode)")
    ap.add_argument("--spec", help="job spec JSON (written by 'schedsim replay')")
    ap.add_argument("--json", help="rank 0 writes the measured Timeline JSON here")
    ap.add_argument("--check-grads", action="store_true")
    ap.add_argument("--backend", choices=["gloo", "nccl"])
    ap.add_argument("--timeout", type=float)
    ap.add_argument("--profile-dir", help="write rank{r}.json torch.profiler traces here")
    a = ap.parse_args(argv)
    from .worker import main_worker, report_failure

    if a.spec:
        return main_worker(a.spec)
    if not a.scenario:
        ap.error("give a scenario file (or --spec)")
    spec = None
    try:
        from ..scenario import load_scenario
        from .config import spec_from_scenario
        from .worker import run_rank

        spec = spec_from_scenario(load_scenario(a.scenario), backend=a.backend,
                                  timeout=a.timeout, check_grads=a.check_grads,
                                  profile_dir=a.profile_dir)
        res = run_rank(spec)
    except BaseException as e:  # noqa: BLE001 - report, exit 1
        report_failure(spec, e)
        return 1
    if res is None:
        return 0
    tl = res["timeline"]
    print(f"measured makespan {tl['makespan']:.3f} ms ({tl['schedule']}, {tl['ranks']} ranks, "
          f"{tl['backend']})")
    if a.json:
        import json

        from ..io import atomic_write_text

        atomic_write_text(a.json, json.dumps(tl))
    gc = tl.get("grad_check")
    if gc is not None:
        print(f"gradient check {'passed' if gc['passed'] else 'FAILED'}: max relative error "
              f"{gc['max_rel_error']:.2e} (tolerance {gc['tolerance']:g})")
        if not gc["passed"]:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
