"""Record what megatron.core's pipeline schedules really issue, rank by rank, as program
tokens: the references of ``tests/test_megatron_exact.py``. Run by hand, not by CI (CI has
no megatron-core)::

    python benchmarks/record_megatron.py --mcore DIR [--out tests/data/megatron]

``DIR`` holds the ``megatron`` package of the megatron-core wheel (``pip download
megatron-core==0.19.2 --no-deps``, unzipped; the wheel needs Python >= 3.12 to install, but
the pipeline code imports on 3.11 with torch 2.13 CPU once the triton-only MoE kernels are
stubbed, as done here). Nothing here needs a GPU or a process group.

How: :func:`record` runs megatron.core's own ``forward_backward_pipelining_without_interleaving``
/ ``forward_backward_pipelining_with_interleaving`` once per pipeline rank, in-process, with

- a fake ``torch.distributed`` underneath ``p2p_communication.py``: ``isend``/``irecv``
  (one launch each, a bare token), ``P2POp`` + ``batch_isend_irecv`` (one launch,
  ``BATCH[...]``, returning one work for the whole batch as NCCL's coalescing manager does),
  and each work's ``.wait()`` (``WAIT[...]`` of the ops that work covers);
- ``schedules.forward_step`` / ``backward_step`` replaced by stand-ins that log the compute
  token (``{stage}F{mb}``, ``{stage}BW{mb}``) and return tagged tensors;
- CUDA calls (``current_device``, ``synchronize``, ``torch.zeros(device="cuda")``) on CPU.

Names: a send is named by the tensor it carries (its producer's stage and microbatch); a
receive by the compute op Megatron hands the received tensor to (so the name is Megatron's
own bookkeeping, not a guess from launch order). Under ``variable_seq_lengths`` each tensor
has a distinct shape ``(1, 1, uid)``: the shape round's sends carry that uid, and each fake
shape receive writes its own uid, so the data receive Megatron allocates from it names it.
Shape messages are written ``SEND_FS``/``RECV_FS`` (the shape of an activation) and
``SEND_BS``/``RECV_BS`` (of a gradient), with the stage and microbatch of the data they
announce.

Each recording also lists, per ordered pair of ranks and communicator, where launch-order
matching (what NCCL does) would pair a send with a receive of another message: the
crossed exchanges of 2-rank interleaving that Megatron-LM's training arguments refuse.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.abc
import importlib.machinery
import itertools
import json
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

#: the Megatron-LM tree whose pipeline code the wheel ships (checked by :func:`_check_commit`)
COMMIT = "f8837c04ef6cbef6cdefb8de001aad63178aebbf"
BRANCH = "core_r0.19.0"
WHEEL = "megatron-core 0.19.2"

_STUB = ("megatron.core.transformer.moe.ops",)      # triton kernels, never called here


class _Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import the triton-only MoE kernel package as an inert module."""

    def find_spec(self, name, path, target=None):
        if any(name == s or name.startswith(s + ".") for s in _STUB):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = mock.MagicMock(name=spec.name)
        m.__path__, m.__spec__ = [], spec
        return m

    def exec_module(self, module):
        pass


class _Group:
    def __init__(self, rank: int, size: int, name: str) -> None:
        self._rank, self._size, self.name = rank, size, name

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


class _Rec:
    """One launched P2P op; ``name`` set at launch (sends) or when consumed (receives)."""

    def __init__(self, send: bool, tensor, peer: int, group: str, shape: bool) -> None:
        self.send, self.tensor, self.peer, self.group, self.shape = (
            send, tensor, peer, group, shape)
        self.name: str | None = None
        self.key: tuple | None = None        # (message kind, producing stage, mb)


class _Work:
    def __init__(self, log: list, recs: list[_Rec]) -> None:
        self.log, self.recs = log, recs

    def wait(self) -> None:
        self.log.append(("wait", self.recs))


class _Rank:
    """The fake world of one pipeline rank."""

    def __init__(self, p: int, r: int) -> None:
        import torch

        self.torch, self.p, self.r = torch, p, r
        self.log: list = []
        self.tag: dict[int, tuple] = {}            # id(tensor) -> (kind, stage, mb)
        self.keep: list = []
        self.uid = itertools.count(1)
        self.by_uid: dict[int, tuple] = {}
        self.shape_recv_by_uid: dict[int, _Rec] = {}
        self.recv_by_id: dict[int, _Rec] = {}
        self.shape_of: dict[int, _Rec] = {}        # id(data recv) -> its shape recv
        self.recs: list[_Rec] = []
        self.pp = _Group(r, p, "pp")
        self.world = _Group(r, p, "world")

    # -- tensors ---------------------------------------------------------------------------
    def tensor(self, key: tuple):
        u = next(self.uid)
        t = self.torch.zeros((1, 1, u))
        self.tag[id(t)], self.by_uid[u] = key, key
        self.keep.append(t)
        return t

    # -- fake torch.distributed --------------------------------------------------------------
    def _rec(self, send: bool, tensor, peer: int, group) -> _Rec:
        g = "world" if group is self.world else "pp"
        shape = tensor.dtype == self.torch.int64
        rec = _Rec(send, tensor, peer, g, shape)
        if send:
            if shape:
                key = self.by_uid[int(tensor.tolist()[2])]
            else:
                key = self.tag[id(tensor)]
            rec.key = key
            rec.name = f"{key[1]}SEND_{key[0]}{'S' if shape else ''}{key[2]}"
        elif shape:
            u = next(self.uid)
            tensor.copy_(self.torch.tensor([1, 1, u]))
            self.shape_recv_by_uid[u] = rec
        else:
            self.recv_by_id[id(tensor)] = rec
            if tuple(tensor.shape)[:2] == (1, 1) and tensor.shape[2] in self.shape_recv_by_uid:
                self.shape_of[id(tensor)] = self.shape_recv_by_uid.pop(tensor.shape[2])
            self.keep.append(tensor)
        self.recs.append(rec)
        return rec

    def isend(self, tensor, dst, group=None, tag=0):
        rec = self._rec(True, tensor, dst, group)
        self.log.append(("post", [rec]))
        return _Work(self.log, [rec])

    def irecv(self, tensor, src, group=None, tag=0):
        rec = self._rec(False, tensor, src, group)
        self.log.append(("post", [rec]))
        return _Work(self.log, [rec])

    def p2p_op(self, op, tensor, peer, group=None, tag=0):
        return SimpleNamespace(op=op, tensor=tensor, peer=peer, group=group)

    def batch_isend_irecv(self, ops):
        recs = [self._rec(o.op == self.isend, o.tensor, o.peer, o.group) for o in ops]
        self.log.append(("batch", recs))
        return [_Work(self.log, recs)]                 # NCCL: one coalesced work

    # -- stand-in compute ------------------------------------------------------------------
    def _consume(self, t, kind: str, stage: int, mb: int) -> None:
        if isinstance(t, list):
            t = t[0] if t else None
        if t is None:
            return
        rec = self.recv_by_id[id(t)]
        assert rec.name is None, f"rank {self.r}: one receive handed to two ops"
        key = (kind, stage + (-1 if kind == "F" else 1), mb)
        rec.key = key
        rec.name = f"{stage}RECV_{kind}{mb}"
        sh = self.shape_of.get(id(t))
        if sh is not None:
            sh.key, sh.name = key, f"{stage}RECV_{kind}S{mb}"

    def forward_step(self, *args, **kw):
        input_tensor = args[4]
        vp = kw.get("vp_stage")
        stage, mb = (vp or 0) * self.p + self.r, kw["current_microbatch"]
        self._consume(input_tensor, "F", stage, mb)
        self.log.append(("compute", f"{stage}F{mb}"))
        return self.tensor(("F", stage, mb)), self.torch.zeros([], dtype=self.torch.int)

    def backward_step(self, input_tensor, output_tensor, output_tensor_grad, config):
        out = output_tensor[0] if isinstance(output_tensor, list) else output_tensor
        _, stage, mb = self.tag[id(out)]
        self._consume(output_tensor_grad, "B", stage, mb)
        self.log.append(("compute", f"{stage}BW{mb}"))
        unwrap = not isinstance(input_tensor, list)
        ins = [input_tensor] if unwrap else input_tensor
        grads = [None if x is None else self.tensor(("B", stage, mb)) for x in ins]
        return grads[0] if unwrap else grads

    # -- the program -----------------------------------------------------------------------
    def tokens(self) -> list[str]:
        out = []
        for what, x in self.log:
            if what == "compute":
                out.append(x)
                continue
            names = [rec.name for rec in x]
            assert None not in names, f"rank {self.r}: a receive no op consumed"
            if what == "post":
                out.append(names[0])
            elif what == "batch":
                out.append("BATCH[" + "+".join(names) + "]")
            else:
                out.append("WAIT[" + "+".join(names) + "]")
        return out


def _crossed(ranks: list[_Rank]) -> list[str]:
    """Pairs that NCCL's launch-order matching would cross: for each (sender, receiver,
    communicator), the k-th send and the k-th receive carry different messages."""
    out = []
    for a, b in itertools.permutations(range(len(ranks)), 2):
        for g in ("pp", "world"):
            sends = [x for x in ranks[a].recs if x.send and x.peer == b and x.group == g]
            recvs = [x for x in ranks[b].recs if not x.send and x.peer == a and x.group == g]
            assert len(sends) == len(recvs), (a, b, g)
            for s, v in zip(sends, recvs):
                if (s.key, s.shape) != (v.key, v.shape):
                    out.append(f"{s.name}~{v.name}")
    return out


def record(p: int, m: int, v: int | None, flags: dict, group_size: int | None = None):
    """Per-rank tokens of one megatron.core step: ``(rows, crossed)``; ``v`` None runs
    ``forward_backward_pipelining_without_interleaving``. Raises what Megatron raises."""
    import torch
    import torch.distributed as dist
    from megatron.core.pipeline_parallel import p2p_communication as P
    from megatron.core.pipeline_parallel import schedules as S
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.transformer_config import TransformerConfig

    rows, ranks = [], []
    zeros = torch.zeros

    def cpu_zeros(*a, **kw):
        if kw.get("device") == "cuda":
            kw["device"] = "cpu"
        return zeros(*a, **kw)

    for r in range(p):
        w = _Rank(p, r)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = TransformerConfig(
                num_layers=p * (v or 1), hidden_size=1, num_attention_heads=1,
                pipeline_model_parallel_size=p, virtual_pipeline_model_parallel_size=v,
                microbatch_group_size_per_vp_stage=group_size,
                pipeline_dtype=torch.float32, moe_token_dispatcher_type="alltoall",
                **flags)
        models = []
        for _ in range(v or 1):
            mod = torch.nn.Module()
            mod.config, mod.model_type = cfg, None
            models.append(mod)
        tp_cp = SimpleNamespace(size=lambda: 1, rank=lambda: 0)
        pgs = ProcessGroupCollection()
        pgs.tp, pgs.cp = tp_cp, tp_cp
        patches = [
            mock.patch.object(dist, "isend", w.isend),
            mock.patch.object(dist, "irecv", w.irecv),
            mock.patch.object(dist, "P2POp", w.p2p_op),
            mock.patch.object(dist, "batch_isend_irecv", w.batch_isend_irecv),
            mock.patch.object(dist, "get_global_rank", lambda g, i: i),
            mock.patch.object(dist, "get_backend", lambda g=None: "nccl"),
            mock.patch.object(dist, "is_initialized", lambda: True),
            mock.patch.object(dist, "group", SimpleNamespace(WORLD=w.world)),
            mock.patch.object(torch.cuda, "current_device", lambda: "cpu"),
            mock.patch.object(torch.cuda, "synchronize", lambda *a: None),
            mock.patch.object(torch, "zeros", cpu_zeros),
            mock.patch.object(S, "forward_step", w.forward_step),
            mock.patch.object(S, "backward_step", w.backward_step),
        ]
        for x in patches:
            x.start()
        try:
            comm = P.P2PCommunicator(pp_group=w.pp, config=cfg)
            fn = (S.forward_backward_pipelining_without_interleaving if v is None
                  else S.forward_backward_pipelining_with_interleaving)
            fn(forward_step_func=None, data_iterator=[None] * len(models) if v else None,
               model=models if v else models[0], num_microbatches=m, seq_length=1,
               micro_batch_size=1, p2p_communicator=comm, pg_collection=pgs)
        finally:
            for x in reversed(patches):
                x.stop()
        rows.append(" ".join(w.tokens()))
        ranks.append(w)
    return rows, _crossed(ranks)


# -- what is recorded ----------------------------------------------------------------------
BOOLS = (False, True)


def combos(interleaved: bool) -> list[dict]:
    """Every combination of the five knobs megatron.core accepts for the schedule."""
    out = []
    for batch, overlap, flush, dealloc, var in itertools.product(BOOLS, repeat=5):
        if overlap and batch:
            continue                        # "Can not use both overlap_p2p_comm and batch"
        if flush and not overlap:
            continue                        # ModelParallelConfig refuses it
        if overlap and not interleaved:
            continue                        # the 1F1B schedule raises
        out.append(dict(batch_p2p_comm=batch, overlap_p2p_comm=overlap,
                        overlap_p2p_comm_warmup_flush=flush,
                        deallocate_pipeline_outputs=dealloc, variable_seq_lengths=var))
    return out


def shapes_1f1b() -> list[tuple[int, int]]:
    return [(p, m) for p in range(2, 9) for m in sorted({1, p - 1, p, p + 1, 2 * p + 1})]


def shapes_interleaved() -> list[tuple[int, int, int, int]]:
    """(p, v, m, N): N = p (Megatron's default group size) with m = p, 2p (and 3p up to
    p = 4); N = m = p + 1 (one group, m not a multiple of p); up to p = 4 also v = 3 and
    m = 2p + 1 with N = p + 1 (a last group of p microbatches)."""
    out = []
    for p in range(2, 9):
        small = p <= 4
        for v in (2, 3) if small else (2,):
            out += [(p, v, p, p), (p, v, 2 * p, p), (p, v, p + 1, p + 1)]
            if small:
                out += [(p, v, 3 * p, p), (p, v, 2 * p + 1, p + 1)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mcore", required=True, help="dir holding the wheel's megatron/")
    ap.add_argument("--out", default=str(Path(__file__).parent.parent / "tests/data/megatron"))
    a = ap.parse_args()
    sys.path.insert(0, a.mcore)
    import torch.utils.flop_counter  # noqa: F401  (before the stub, which it would probe)
    sys.meta_path.insert(0, _Stub())
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, inter in (("1f1b", False), ("interleaved", True)):
        runs, programs, index = [], [], {}
        for flags in combos(inter):
            for shape in (shapes_interleaved() if inter else shapes_1f1b()):
                if inter:
                    p, v, m, n = shape
                    rows, crossed = record(p, m, v, flags, n)
                else:
                    p, m = shape
                    v = n = None
                    rows, crossed = record(p, m, None, flags)
                key = "\n".join(rows)
                if key not in index:
                    index[key] = len(programs)
                    programs.append(rows)
                runs.append(dict(p=p, m=m, v=v, group_size=n, flags=flags,
                                 program=index[key], crossed=crossed))
        doc = dict(source=f"NVIDIA/Megatron-LM {BRANCH} @ {COMMIT} ({WHEEL} wheel)",
                   function=("forward_backward_pipelining_with_interleaving" if inter else
                             "forward_backward_pipelining_without_interleaving"),
                   recorder="benchmarks/record_megatron.py",
                   tokens="program text tokens, one string per rank; programs shared by "
                          "the runs (flag combinations) that issue the same one",
                   runs=runs, programs=programs)
        path = out / f"{name}.json.gz"
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as z:
            z.write(json.dumps(doc, separators=(",", ":")).encode())    # same bytes each run
        print(f"{path}: {len(runs)} runs")


if __name__ == "__main__":
    main()
