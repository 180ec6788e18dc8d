"""Timeline JSON input (:meth:`schedsim.timeline.Timeline.read_json`): an unknown key, top
level or in a record, is refused with the nearest known one; every key schedsim's own
writers emit is accepted; a ``per_rank`` summary (or ``makespan``) its spans contradict is
refused naming the rank and the field."""
from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from schedsim.cli import app
from schedsim.errors import ScenarioError
from schedsim.timeline import Timeline
from schedsim.timeline_check import top_level_keys

runner = CliRunner()


def _cli(*args: object) -> object:
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def tl_json(tmp_path_factory) -> dict:
    """A simulated 1F1B on 2 ranks x 4 microbatches (F=1, B=2: makespan 15)."""
    p = tmp_path_factory.mktemp("tl") / "tl.json"
    r = _cli("simulate", "-s", "1f1b", "-p", "2", "-m", "4", "-q", "--json", p)
    assert r.exit_code == 0, r.output
    d = json.loads(p.read_text())
    assert d["makespan"] == 15.0 and [x["busy"] for x in d["per_rank"]] == [12.0, 12.0]
    return d


def _refused(tmp_path: Path, d: dict) -> str:
    """The one stderr line of ``stalls`` on the Timeline ``d`` (exit 2)."""
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    r = _cli("stalls", p)
    assert r.exit_code == 2 and r.stdout == "", r.output
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in r.output
    assert err.startswith(f"error: {p}: ")
    return err


def _edited(d: dict, change) -> dict:
    d = json.loads(json.dumps(d))
    change(d)
    return d


# -- unknown keys ----------------------------------------------------------------------
def test_unknown_top_level_key_is_refused_with_the_nearest(tmp_path, tl_json) -> None:
    err = _refused(tmp_path, {**tl_json, "stepp": 3})
    assert "not a valid timeline: top level: unknown key 'stepp' (did you mean 'step'?): " \
           "expected one of schedule, ranks, stages" in err
    assert "grad_check" in err and "clock_offsets_ns" in err     # the accepted keys listed


def test_a_misspelt_required_key_is_named_not_only_missing(tmp_path, tl_json) -> None:
    d = {("makspan" if k == "makespan" else k): v for k, v in tl_json.items()}
    err = _refused(tmp_path, d)
    assert "not a schedsim timeline JSON: top level: unknown key 'makspan' (did you mean " \
           "'makespan'?)" in err


def test_unknown_key_of_a_per_rank_record_is_refused(tmp_path, tl_json) -> None:
    err = _refused(tmp_path, _edited(tl_json, lambda d: d["per_rank"][1].update(bubble=0.1)))
    assert err.endswith("per_rank.1: unknown key 'bubble' (did you mean 'bubble_ratio'?): "
                        "expected one of rank, busy, idle, bubble_ratio, first_start, "
                        "last_end")


def test_unknown_key_of_a_span_gets_its_suggestion(tmp_path, tl_json) -> None:
    err = _refused(tmp_path, _edited(tl_json, lambda d: d["spans"][0].update(strat=0.0)))
    assert "spans.0: unknown key 'strat' (did you mean 'start'?)" in err


def test_every_top_level_key_schedsim_writes_is_accepted(tmp_path) -> None:
    """Files of each writer read back: a simulation (atomic groups, a deadlock, a [model]
    with pieces, a [workload]), an imported multi-step trace, the shipped measured replays;
    tp / tp_comm (a TP replay's) on a measured one."""
    files = []
    for name, args in [("atomic", ["schedules/pippy-969.toml", "--group-semantics", "atomic"]),
                       ("deadlock", ["schedules/crossed-sends.toml"]),
                       ("moe", ["schedules/1f1b-overlap-moe.toml"]),
                       ("wl", ["schedules/llama3-70b-h100.toml"])]:
        p = tmp_path / f"{name}.json"
        r = _cli("simulate", *args, "-q", "--json", p)
        assert r.exit_code == (3 if name == "deadlock" else 0), r.output
        files.append(p)
    p = tmp_path / "imp.json"
    r = _cli("import-trace", *sorted(glob.glob("docs/examples/traces/gpipe/rank*.json.gz")),
             "--json", p)
    assert r.exit_code == 0, r.output
    files.append(p)
    shipped = sorted(Path("docs/img/replay").glob("*-measured.json"))
    assert len(shipped) == 2
    files += shipped
    d = json.loads(shipped[0].read_text())
    p = tmp_path / "tp.json"
    p.write_text(json.dumps({**d, "tp": 2, "tp_comm": "domino"}))
    files.append(p)
    seen = set()
    for f in files:
        tl = Timeline.read_json(f)
        seen |= set(json.loads(Path(f).read_text()))
        assert (tl.deadlock is not None) == (f.name == "deadlock.json")
    written = {"group_semantics", "pieces", "workload", "import_notes", "p2p", "trace_source",
               "posts", "program", "step", "step_makespans", "backend", "world_size",
               "device", "clock", "clock_offsets_ns", "grad_check", "tp", "tp_comm"}
    assert written <= seen <= set(top_level_keys(Timeline))


# -- the summary against the spans -----------------------------------------------------
@pytest.mark.parametrize("field,value,spans", [
    ("busy", 11.0, "12.0"), ("idle", 4.0, "3.0"), ("bubble_ratio", 0.5, "0.2"),
    ("first_start", 0.5, "1.0"), ("last_end", None, "13.0"), ("rank", 0, "1")])
def test_per_rank_that_its_spans_contradict_is_refused(tmp_path, tl_json, field, value,
                                                       spans) -> None:
    err = _refused(tmp_path, _edited(tl_json, lambda d: d["per_rank"][1].update(
        {field: value})))
    assert err.endswith(f"not a valid timeline: per_rank[1] (rank 1) has {field} "
                        f"{value!r} but its spans give {spans}: per_rank is the summary of "
                        f"the spans (busy: their durations, idle: makespan - busy); fix it "
                        f"or the spans")


def test_makespan_that_the_spans_contradict_is_refused(tmp_path, tl_json) -> None:
    err = _refused(tmp_path, {**tl_json, "makespan": 20.0})
    assert err.endswith("not a valid timeline: makespan is 20.0 but the spans end at 15.0: "
                        "the makespan is the end of the last span")


def test_a_span_moved_without_its_summary_is_refused(tmp_path, tl_json) -> None:
    """The edit of a span (rank 0's first op 1 later) that leaves per_rank as it was."""
    def move(d: dict) -> None:
        s = next(s for s in d["spans"] if s["rank"] == 0 and s["start"] == 0.0)
        s["start"] = 0.5
    err = _refused(tmp_path, _edited(tl_json, move))
    assert "per_rank[0] (rank 0) has busy 12.0 but its spans give 11.5" in err


def test_read_json_raises_scenario_error(tmp_path, tl_json) -> None:
    p = tmp_path / "x.json"
    p.write_text(json.dumps({**tl_json, "grad_chek": {}}))
    with pytest.raises(ScenarioError, match=r"did you mean 'grad_check'\?"):
        Timeline.read_json(p)
    p.write_text(json.dumps(tl_json))
    assert Timeline.read_json(p).makespan == 15.0


# -- a workload object's numbers against their inputs ------------------------------------
@pytest.fixture(scope="module")
def wl_json(tmp_path_factory) -> dict:
    """The Timeline JSON of the shipped Llama 3 70B on H100 scenario (a [workload])."""
    p = tmp_path_factory.mktemp("wl") / "wl.json"
    r = _cli("simulate", "schedules/llama3-70b-h100.toml", "-q", "--json", p)
    assert r.exit_code == 0, r.output
    return json.loads(p.read_text())


@pytest.mark.parametrize("field,value,rule", [
    ("step_ms", 1.0, "makespan_ms + step_boundary_ms"),
    ("makespan_ms", 5.0, "the timeline's makespan"),
    ("tokens_per_s_per_gpu", 1e9, "tokens_per_step / step s / gpus"),
    ("mfu", 0.99, "model_flops_per_step / (step s x gpus x peak_flops)")])
def test_a_workload_number_its_inputs_contradict_is_refused(tmp_path, wl_json, field, value,
                                                           rule) -> None:
    """A new user's edit (step_ms 1.0, tokens/s 1e9) was accepted and `report` printed
    "step 1.0 ms (makespan 2115.3 + step boundary 20.3)"."""
    wl = wl_json["workload"]
    s = (wl["makespan_ms"] + wl["step_boundary_ms"]) / 1e3
    assert wl["step_ms"] == pytest.approx(s * 1e3, rel=1e-12)
    assert wl["tokens_per_s_per_gpu"] == pytest.approx(wl["tokens_per_step"] / s / wl["gpus"],
                                                       rel=1e-12)
    err = _refused(tmp_path, _edited(wl_json, lambda d: d["workload"].__setitem__(field, value)))
    assert f"workload: {field} is {value!r} but {rule} gives " in err


def test_a_workload_fits_flag_its_peaks_contradict_is_refused(tmp_path, wl_json) -> None:
    fits = wl_json["workload"]["fits"]
    err = _refused(tmp_path, _edited(wl_json,
                                     lambda d: d["workload"].__setitem__("fits", not fits)))
    assert f"workload: fits is {not fits} but the worst peak" in err
    p = tmp_path / "untouched.json"
    p.write_text(json.dumps(wl_json))
    assert Timeline.read_json(p).workload["fits"] is fits      # as written: accepted
