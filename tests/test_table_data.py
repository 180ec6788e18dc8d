"""``--format json|csv`` as data for a script (schedsim/cli/tables.py): one document,
each table under a stable id (not its human title, which changes with the run), columns
under stable keys, numeric cells exact numbers; csv with several tables marks each with
``# table: ID``."""
from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path

from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.cli.tables import DataTable, column_key, num, tables_data

WORKLOAD = """[schedule]
name = "1f1b"
[workload]
model = "llama3.1-8b"
gpu = "h100-sxm"
num_gpus = {gpus}
seq = 4096
global_batch_size = {gbs}
tp = 2
pp = {pp}
recompute = "selective"
"""


def _scenario(tmp: Path, name: str, **kw: int) -> Path:
    p = tmp / f"{name}.toml"
    p.write_text(WORKLOAD.format(**kw))
    return p


def _run(*args: object) -> object:
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


def test_simulate_json_is_keyed_by_id_with_exact_numbers(tmp_path: Path) -> None:
    """Two different runs: the same table ids and column keys (their titles differ);
    the numbers are numbers, equal to the Timeline's exact values."""
    docs, tls = [], []
    for i, kw in enumerate([dict(gpus=8, gbs=32, pp=4), dict(gpus=8, gbs=64, pp=2)]):
        sc = _scenario(tmp_path, f"s{i}", **kw)
        out = tmp_path / f"tl{i}.json"
        r = _run("simulate", sc, "--format", "json", "--json", out)
        docs.append(json.loads(r.stdout))
        tls.append(json.loads(out.read_text()))
    a, b = docs
    assert list(a) == list(b) == ["ranks", "stages", "workload"]
    for k in a:
        assert a[k]["columns"] == b[k]["columns"]
    assert a["ranks"]["title"] != b["ranks"]["title"]
    assert a["ranks"]["columns"] == ["rank", "busy", "idle", "bubble_ratio", "first_start",
                                     "last_end"]
    assert a["workload"]["columns"][:2] == ["rank", "params_gib"]
    for doc, tl in zip(docs, tls):
        ranks = doc["ranks"]
        assert ranks["unit"] == tl["unit"] == "ms"
        assert max(r["last_end"] for r in ranks["rows"]) == tl["makespan"]
        assert [r["busy"] for r in ranks["rows"]] == [p["busy"] for p in tl["per_rank"]]
        assert all(isinstance(v, (int, float)) for r in ranks["rows"] for v in r.values())
        # the table rounds what json keeps exact: a busy time is not a 4-digit string
        assert any(not float(r["busy"]).is_integer() for r in ranks["rows"])
        w = doc["workload"]["rows"]
        assert len(w) == tl["ranks"] and all(isinstance(r["peak_gib"], float) for r in w)


def test_simulate_csv_marks_each_of_several_tables(tmp_path: Path) -> None:
    sc = _scenario(tmp_path, "s", gpus=8, gbs=32, pp=4)
    doc = json.loads(_run("simulate", sc, "--format", "json").stdout)
    text = _run("simulate", sc, "--format", "csv").stdout
    blocks = text.rstrip("\n").split("\n\n")
    assert len(blocks) == len(doc) == 3
    for block, (tid, t) in zip(blocks, doc.items()):
        first, *body = block.split("\n")
        assert first == f"# table: {tid}"
        header, *rows = list(csv.reader(io.StringIO("\n".join(body))))
        assert header == t["columns"] and len(rows) == len(t["rows"])
        for row, rec in zip(rows, t["rows"]):
            for cell, k in zip(row, header):
                v = rec[k]
                assert cell == ("" if v is None else repr(v) if isinstance(v, float)
                                else str(v))


def test_one_table_csv_is_plain_csv() -> None:
    text = _run("simulate", "-s", "1f1b", "-p", "2", "-m", "2", "--cost", "F=1,BW=2",
                "--format", "csv").stdout
    assert text.splitlines() == ["rank,busy,idle,bubble_ratio,first_start,last_end",
                                 f"0,6,3,{1 / 3!r},0,9", f"1,6,3,{1 / 3!r},1,7"]


def test_plan_quiet_json_candidates_are_exact() -> None:
    from schedsim.plan import PlanSpace
    from schedsim.plan.driver import run_plan

    args = ["plan", "--model", "llama3.1-8b", "--gpus", "8", "--gpu", "h100-sxm", "--tp",
            "2", "--pp", "4", "--schedules", "1f1b,zbv", "--recompute", "none", "-j", "1"]
    doc = json.loads(_run(*args, "-q", "--format", "json").stdout)
    assert list(doc) == ["candidates"]
    res = run_plan(PlanSpace(model="llama3.1-8b", gpus=8, gpu="h100-sxm", tp=[2], pp=[4],
                             schedules=["1f1b", "zbv"], recompute=["none"]), top=5)
    rows = doc["candidates"]["rows"]
    assert [r["n"] for r in rows] == list(range(1, len(res.top(5)) + 1))
    assert [(r["schedule"], r["step_ms"], r["tokens_s_gpu"], r["mfu"]) for r in rows] == [
        (x.candidate.schedule, x.step_ms, x.tokens_per_s_per_gpu, x.mfu) for x in res.top(5)]


def test_compare_json_rows_are_numbers() -> None:
    doc = json.loads(_run("compare", "-p", "4", "-m", "8", "--schedules", "1f1b,zbv",
                          "--format", "json").stdout)
    rows = doc["schedules"]["rows"]
    assert [(r["schedule"], r["makespan"], r["bubble"]) for r in rows] == [
        ("1f1b", 33, 9 / 33), ("zbv", 25.5, rows[1]["bubble"])]
    assert math.isclose(rows[1]["bubble"], 0.0588235294117647)


def test_cells_and_keys() -> None:
    from rich.table import Table

    assert (num(3.0), num(2.5, "2.50"), num(float("nan"), "nan").value, num(None)) == (
        "3.0", "2.50", None, "-")
    assert num(3.0).value == 3 and isinstance(num(3.0).value, int)
    assert [column_key(h) for h in ("step ms", "tokens/s/GPU", "#", "MFU %", "act GiB")] == [
        "step_ms", "tokens_s_gpu", "n", "mfu_pct", "act_gib"]
    t = DataTable("ranks", title="x", unit="ms")
    t.add_column("rank")
    t.add_column("busy", key="busy_ms")
    t.add_column("note")
    t.add_row("0", num(1.23456, "1.235"), "-")
    t.add_row("1", num(2, "2"), "a 1")
    u = Table(title="plain")
    u.add_column("n")
    u.add_row("1,024")
    d = tables_data([t, t, u])
    assert list(d) == ["ranks", "ranks_2", "table"]
    assert d["ranks"]["rows"] == [{"rank": 0, "busy_ms": 1.23456, "note": None},
                                  {"rank": 1, "busy_ms": 2, "note": "a 1"}]
    assert d["ranks"]["unit"] == "ms" and d["table"]["rows"] == [{"n": 1024}]


def test_every_cli_table_has_a_stable_id() -> None:
    """No command prints a bare rich Table (its csv/json key would be 'table')."""
    root = Path(__file__).resolve().parents[1] / "schedsim" / "cli"
    bare = [f"{p.name}:{i}" for p in sorted(root.glob("*.py")) if p.name != "tables.py"
            for i, ln in enumerate(p.read_text().splitlines(), 1)
            if re.search(r"(?<![A-Za-z_])Table\(", ln)]
    assert bare == []
