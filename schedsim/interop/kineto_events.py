"""What the events of one rank's Kineto trace mean: pipeline ranges and P2P calls. No torch.

Two kinds of things are recognised among the complete (``"ph": "X"``) events of a rank:

**Ranges** (:class:`Range`), ``record_function`` ranges a pipeline executor writes:

- ``schedsim:<token>``: schedsim's replay, one range per program instruction: a compute
  token (``0F1``, ``3BW0``, ``(0F3;3BW1)``), a launch (a bare post ``1SEND_F0`` or
  ``BATCH[0SEND_F1+0RECV_B0]``; the older ``POST[a+b]`` reads as one launch of its ops),
  a wait (``COMMIT``, ``WAIT[...]``, ``END``);
- ``PP:<action>``: torch.distributed.pipelining's ``_PipelineScheduleRuntime``
  (``torch/distributed/pipelining/schedules.py``, ``_get_profiler_function_name``, torch
  2.13): compute ``{stage}F{mb}``, ``I`` (input backward: schedsim's ``B``), ``W``, ``B``
  (full backward: schedsim's ``BW``), ``(a;b)OVERLAP_F_B``; the comm actions
  ``SEND_F``/``RECV_F``/``SEND_B``/``RECV_B`` (each one ``isend``/``irecv``: torch's
  ``_batch_p2p`` launches an all-send or all-recv list op by op); the bookkeeping actions
  ``UNSHARD``/``RESHARD``/``REDUCE_GRAD`` are recognised and left out of the program;
- ``Forward {mb}`` / ``Backward {mb}``: torch's one-stage executor
  (``PipelineScheduleSingle``), recorded by ``ScheduleGPipe`` (and the forward-only
  schedule): stage = rank, kinds ``F`` and ``BW``; each range holds the recv, its wait,
  the compute and the send of that op. torch 2.13's ``Schedule1F1B`` records **no**
  range: its traces cannot be imported (:func:`classify_rank` says so).

**P2P calls** (:class:`Call`): ``c10d::send`` / ``c10d::recv_`` / ``c10d::recv_any_source_``
(the host time of one ``isend``/``irecv``, also inside ``batch_isend_irecv``), each with
its work range, ``gloo:send``/``gloo:recv`` or ``nccl:send``/``nccl:recv``, which starts
inside the call and ends when the ``wait()`` for it returns (measured with torch 2.13 on
gloo; NCCL untested), and, on GPUs, the ``ncclDevKernel_SendRecv``/``ncclKernel_SendRecv``
kernel launched from inside the call (matched by the ``correlation`` of its
``cudaLaunchKernel``; untested). With ``record_shapes=True`` the call's ``Concrete
Inputs`` name the peer and its ``Input Dims`` (with the work's ``Input type``) the bytes.
"""
from __future__ import annotations

import math
import re
from bisect import bisect_right
from typing import Any, NamedTuple

from schedsim.errors import ScenarioError, SchedsimError
from schedsim.program.ir import Batch, Comm, Commit, Compute, Op, Post, Wait
from schedsim.program.tokens import parse_comm, parse_instr

_TORCH_COMPUTE = re.compile(r"(\d+)(F|I|W|B)(\d+)")
_TORCH_COMM = re.compile(r"(\d+)(SEND_F|RECV_F|SEND_B|RECV_B)(\d+)")
_TORCH_FB = re.compile(r"\((.+);(.+)\)OVERLAP_F_B")
_TORCH_BOOK = re.compile(r"(\d*)(UNSHARD|RESHARD|REDUCE_GRAD)(\d*)")
_TORCH_KIND = {"F": "F", "I": "B", "W": "W", "B": "BW"}
_SINGLE = re.compile(r"(Forward|Backward) (\d+)")
_SEND_CALLS = ("c10d::send",)
_RECV_CALLS = ("c10d::recv_", "c10d::recv_any_source_")
_WORKS = {"gloo:send": True, "gloo:recv": False, "nccl:send": True, "nccl:recv": False,
          "nccl:recv_any_source": False}
_KERNELS = ("ncclDevKernel_SendRecv", "ncclKernel_SendRecv")
_BACKWARD_NODE = "autograd::engine::evaluate_function"
_ITEMSIZE = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8,
             "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1}
#: which executor wrote a range
SOURCES = ("schedsim", "torch-runtime", "torch-single")


class Range(NamedTuple):
    """A recognised range of one rank (times in µs on the trace's clock).

    ``what``: ``compute`` (``op``), ``launch`` (``instr`` is the :class:`Post` or
    :class:`Batch` it is), ``wait`` (``instr`` is :class:`Commit`, :class:`Wait` or None
    for ``END``) or ``bookkeeping``. ``source``: one of :data:`SOURCES`.
    """

    t0: float
    t1: float
    what: str
    source: str
    op: Op | None = None
    instr: Any = None
    name: str = ""


class Call(NamedTuple):
    """One ``isend``/``irecv`` as the comm library saw it (µs): ``t0``/``t1`` the host
    time of the call; ``done`` the end of its work range (when the wait for it returned;
    None without one); ``peer`` and ``nbytes`` when the trace recorded shapes; ``kernel``
    the GPU kernel's ``(start, end)`` when there is one."""

    t0: float
    t1: float
    is_send: bool
    done: float | None = None
    peer: int | None = None
    nbytes: float | None = None
    kernel: tuple[float, float] | None = None


class RankEvents(NamedTuple):
    """What one rank's trace shows: its ranges and P2P calls (each sorted by start), the
    names of the events it did not recognise (for messages about unknown traces), and
    the operator events (``cat`` ``cpu_op``: ``(start, end, is a backward node)``, sorted
    by start), which split an ``OVERLAP_F_B`` range into its forward and backward."""

    ranges: list[Range]
    calls: list[Call]
    other: list[str]
    ops: list[tuple[float, float, bool]] = []


#: the largest |ts| (µs; Kineto's are since the epoch, about 1.8e15 today) and dur (µs: 30
#: days) a trace event may have; 1e30 or -1e308 is a corrupt file, not a time
MAX_TS_US = 1e17
MAX_DUR_US = 30 * 86400 * 1e6
#: the largest tensor dimension read from a trace's ``Input Dims``
MAX_DIM = 2 ** 40


def event_times(e: dict[str, Any], path: Any) -> tuple[float, float]:
    """``(ts, dur)`` of an event in µs. Raises :class:`ScenarioError` naming ``path``
    unless both are finite numbers, ``|ts| <=`` :data:`MAX_TS_US` and ``0 <= dur <=``
    :data:`MAX_DUR_US`."""
    out = []
    for key, default, lo, hi in (("ts", None, -MAX_TS_US, MAX_TS_US),
                                 ("dur", 0.0, 0.0, MAX_DUR_US)):
        v = e.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or not lo <= v <= hi:
            raise ScenarioError(f"{path}: event {e['name']!r} has {key} {v!r}: expected a "
                                f"finite number of µs in {lo:g}..{hi:g}")
        out.append(float(v))
    return out[0], out[1]


def torch_op(text: str) -> Op | None:
    """The op of a torch action text (``1F0``, ``3I2``, ``(0F3;3I1)OVERLAP_F_B``)."""
    m = _TORCH_COMPUTE.fullmatch(text)
    if m:
        return Op(_TORCH_KIND[m.group(2)], int(m.group(1)), int(m.group(3)))
    m = _TORCH_FB.fullmatch(text)
    if m:
        f, b = torch_op(m.group(1)), torch_op(m.group(2))
        if f is not None and b is not None and f.kind == "F" and b.kind in ("B", "BW"):
            return Op.fb(f, b)
    return None


def _schedsim_range(tok: str) -> tuple[str, Op | None, Any] | None:
    if tok.startswith("POST[") and tok.endswith("]"):     # the replay's older launch form
        comms = tuple(parse_comm(t) for t in tok[5:-1].split("+"))
        return "launch", None, Post(comms[0]) if len(comms) == 1 else Batch(comms)
    if tok == "END":
        return "wait", None, None
    ins = parse_instr(tok)
    if isinstance(ins, Compute):
        return "compute", ins.op, None
    if isinstance(ins, (Commit, Wait)):
        return "wait", None, ins
    if isinstance(ins, (Post, Batch)):
        return "launch", None, ins
    return None


def classify_range(name: str, rank: int) -> tuple[str, str, Op | None, Any] | None:
    """``(what, source, op, instr)`` of a range name (module docstring), or None."""
    if name.startswith("schedsim:"):
        got = _schedsim_range(name[len("schedsim:"):])
        return None if got is None else (got[0], "schedsim", got[1], got[2])
    if name.startswith("PP:"):
        text = name[3:]
        m = _TORCH_COMM.fullmatch(text)
        if m:
            return ("launch", "torch-runtime", None,
                    Post(Comm(m.group(2), int(m.group(1)), int(m.group(3)))))
        op = torch_op(text)
        if op is not None:
            return "compute", "torch-runtime", op, None
        if _TORCH_BOOK.fullmatch(text):
            return "bookkeeping", "torch-runtime", None, None
        return None
    m = _SINGLE.fullmatch(name)
    if m:
        kind = "F" if m.group(1) == "Forward" else "BW"
        return "compute", "torch-single", Op(kind, rank, int(m.group(2))), None
    return None


def _shape_info(args: dict[str, Any]) -> tuple[int | None, int | None]:
    """``(peer, elements)`` from a c10d call's recorded inputs (record_shapes)."""
    peer = elems = None
    conc = args.get("Concrete Inputs")
    if isinstance(conc, list) and len(conc) > 2:
        try:
            peer = int(conc[2])
        except (TypeError, ValueError):
            peer = None
    dims = args.get("Input Dims")
    if isinstance(dims, list) and dims and isinstance(dims[0], list):
        first = dims[0][0] if dims[0] and isinstance(dims[0][0], list) else dims[0]
        # a negative or absurd dimension is a corrupt record: its size stays unknown
        if all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM
               for d in first):
            elems = math.prod(first)
    return peer, elems


def _calls(raw: list[tuple[float, float, dict]], works: list[tuple[float, float, bool, dict]],
           kernels: dict[Any, tuple[float, float]], launches: list[tuple[float, Any]]
           ) -> list[Call]:
    """Join each c10d call with its work range (the first unused one of the same
    direction that starts inside the call) and its kernel (by launch correlation)."""
    works = sorted(works, key=lambda w: w[0])
    used = [False] * len(works)
    starts = [w[0] for w in works]
    lstarts = [t for t, _ in launches]
    out = []
    for t0, t1, e in sorted(raw, key=lambda x: x[0]):
        send = e["name"] in _SEND_CALLS
        done = itemsize = None
        for k in range(bisect_right(starts, t0 - 1e-3), len(works)):
            w0, w1, wsend, wargs = works[k]
            if w0 > t1 + 1e-3:
                break
            if not used[k] and wsend == send:
                used[k], done = True, w1
                types = wargs.get("Input type")
                if isinstance(types, list) and types:
                    itemsize = _ITEMSIZE.get(types[0])
                break
        kernel = None
        for k in range(bisect_right(lstarts, t0), len(launches)):
            if launches[k][0] > t1:
                break
            kernel = kernels.get(launches[k][1]) or kernel
        peer, elems = _shape_info(e.get("args") or {})
        nbytes = float(elems * itemsize) if elems is not None and itemsize else None
        if kernel is not None:
            done = kernel[1] if done is None else max(done, kernel[1])
        out.append(Call(t0, t1, send, done, peer, nbytes, kernel))
    return out


def classify_rank(events: list[dict[str, Any]], rank: int, path: Any,
                  offset_us: float) -> RankEvents:
    """The ranges and P2P calls among one rank's complete events (``ts`` + ``offset_us``
    = µs on the common clock). Raises :class:`ScenarioError` for a recognised event
    with bad times; a ``schedsim:`` name that does not parse is not one of ours (left
    out)."""
    ranges: list[Range] = []
    raw: list[tuple[float, float, dict]] = []
    works: list[tuple[float, float, bool, dict]] = []
    kernels: dict[Any, tuple[float, float]] = {}
    launches: list[tuple[float, Any]] = []
    other: list[str] = []
    ops: list[tuple[float, float, bool]] = []
    for e in events:
        name = e["name"]
        try:
            c = classify_range(name, rank)
        except (SchedsimError, ValueError):
            c = None
        is_call = name in _SEND_CALLS or name in _RECV_CALLS
        if c is None and not is_call and name not in _WORKS:
            args = e.get("args") or {}
            if name.startswith(_KERNELS) and "correlation" in args:
                ts, dur = event_times(e, path)
                kernels[args["correlation"]] = (ts + offset_us, ts + dur + offset_us)
            elif e.get("cat") == "cuda_runtime" and "correlation" in args \
                    and "LaunchKernel" in name:
                ts, _ = event_times(e, path)
                launches.append((ts + offset_us, args["correlation"]))
            else:
                other.append(name)
                if e.get("cat") == "cpu_op":
                    ts, dur = event_times(e, path)
                    ops.append((ts + offset_us, ts + dur + offset_us,
                                name.startswith(_BACKWARD_NODE)))
            continue
        ts, dur = event_times(e, path)
        t0, t1 = ts + offset_us, ts + dur + offset_us
        if c is not None:
            ranges.append(Range(t0, t1, c[0], c[1], c[2], c[3], name))
        elif is_call:
            raw.append((t0, t1, e))
        else:
            works.append((t0, t1, _WORKS[name], e.get("args") or {}))
    ranges.sort(key=lambda x: (x.t0, -x.t1))
    launches.sort(key=lambda x: x[0])
    ops.sort()
    return RankEvents(ranges, _calls(raw, works, kernels, launches), other, ops)


def select_step(events: list[dict[str, Any]], step: int | None, path: Any
                ) -> list[dict[str, Any]]:
    """The events of profiler step ``step`` (those starting inside the ``ProfilerStep#N``
    range with that N); all events when ``step`` is None. Raises :class:`ScenarioError`
    when the file has no such step (naming the steps it has)."""
    if step is None:
        return events
    steps = {}
    for e in events:
        n = e["name"]
        if n.startswith("ProfilerStep#"):
            try:
                steps[int(n[len("ProfilerStep#"):])] = event_times(e, path)
            except ValueError:
                continue
    if step not in steps:
        have = ", ".join(map(str, sorted(steps))) or "none"
        raise ScenarioError(f"{path}: no profiler step {step} (ProfilerStep# ranges: "
                            f"{have})")
    ts, dur = steps[step]
    out = []
    for e in events:
        t = e.get("ts")
        if isinstance(t, (int, float)) and not isinstance(t, bool) and ts <= t <= ts + dur:
            out.append(e)
    return out
