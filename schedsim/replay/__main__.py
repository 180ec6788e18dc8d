"""``python -m schedsim.replay``: one rank of a replay.

- ``python -m schedsim.replay --spec FILE``: a rank started by ``schedsim replay --nproc``
  (see :mod:`schedsim.replay.launch`);
- ``torchrun --nnodes N --nproc-per-node G -m schedsim.replay SCENARIO [--json FILE]
  [--check-grads] [--backend gloo|nccl] [--timeout S] [--profile-dir DIR]
  [--no-precheck]``: multi-node; torchrun starts the ranks, rank 0 writes the measured
  Timeline JSON and prints the makespan (and the gradient check).

Exit codes, as ``schedsim replay``'s: 0 ok; 1 this rank failed (an exception, a timeout)
or the gradient check failed; 2 bad input — torch missing, a bad scenario, a program that
deadlocks under rendezvous semantics (refused before the run unless ``--no-precheck``),
an output path that cannot be written — reported as one line on stderr, before the
process group is set up.
"""
from __future__ import annotations

import argparse
import os
import sys

from schedsim.util.units import with_unit

PROG = "python -m schedsim.replay"


def _bad_input(e: Exception, code: int = 2) -> int:
    print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description="Run one rank of a schedsim replay.")
    ap.add_argument("scenario", nargs="?", help="scenario TOML (torchrun mode)")
    ap.add_argument("--spec", help="job spec JSON (written by 'schedsim replay')")
    ap.add_argument("--json", help="rank 0 writes the measured Timeline JSON here")
    ap.add_argument("--check-grads", action="store_true")
    ap.add_argument("--backend", choices=["gloo", "nccl"])
    ap.add_argument("--timeout", type=float)
    ap.add_argument("--profile-dir", help="write rank{r}.json torch.profiler traces here")
    ap.add_argument("--no-precheck", action="store_true",
                    help="run even a program that deadlocks under rendezvous semantics "
                    "(it then hangs until --timeout)")
    a = ap.parse_args(argv)
    from schedsim.errors import SchedsimError
    from schedsim.replay.config import require_torch

    try:
        require_torch()
    except SchedsimError as e:
        return _bad_input(e, e.exit_code)
    from schedsim.replay.worker import main_worker, report_failure

    if a.spec:      # a rank started by the launcher: its results are files by now
        code = main_worker(a.spec)
        sys.stdout.flush()
        sys.stderr.flush()
        # skip interpreter teardown: destructors of torch's C++ comm threads that run
        # there can abort a finished rank ("terminate called without an active exception")
        os._exit(code)
    if not a.scenario:
        ap.error("give a scenario file (or --spec)")
    try:
        from schedsim.replay.config import spec_from_scenario
        from schedsim.scenario import load_scenario
        from schedsim.util.files import check_output_path

        if a.json and os.environ.get("RANK", "0") == "0":
            check_output_path(a.json)        # fail before the run, not after it
        spec = spec_from_scenario(load_scenario(a.scenario), backend=a.backend,
                                  timeout=a.timeout, check_grads=a.check_grads,
                                  profile_dir=a.profile_dir, precheck=not a.no_precheck)
    except SchedsimError as e:
        return _bad_input(e, e.exit_code)
    try:
        from schedsim.replay.worker import run_rank

        res = run_rank(spec)
    except BaseException as e:  # noqa: BLE001 - report, exit 1
        report_failure(spec, e)
        return 1
    if res is None:
        return 0
    tl = res["timeline"]
    print(f"measured makespan {with_unit(tl['makespan'], 'ms')} ({tl['schedule']}, "
          f"{tl['ranks']} ranks, "
          f"{tl['backend']})")
    if a.json:
        import json

        from schedsim.util.files import atomic_write_text

        try:
            atomic_write_text(a.json, json.dumps(tl))
        except SchedsimError as e:
            return _bad_input(e, e.exit_code)
    gc = tl.get("grad_check")
    if gc is not None:
        print(f"gradient check {'passed' if gc['passed'] else 'FAILED'}: max relative error "
              f"{gc['max_rel_error']:.2e} (tolerance {gc['tolerance']:g})")
        if not gc["passed"]:
            return 1
    return 0


def _exit(code: int) -> None:
    """End the rank process with ``code`` once its outputs are written, without the
    interpreter's and C++ runtime's teardown: a backend or profiler thread still
    joinable then makes the C++ runtime abort ("terminate called without an active
    exception", SIGABRT) after the rank's work succeeded (seen in 1 of ~20 profiled
    replays). Every output of a rank is already written and closed (atomic files)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
