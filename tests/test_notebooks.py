"""Every notebook under notebooks/ runs top to bottom without error (nbclient, python3)."""
from __future__ import annotations

import pytest
from conftest import ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert any(p.name == "quickstart.ipynb" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_import_nothing_from_the_cli(path):
    """A notebook uses the Python API (schedsim.api and the packages), not the command
    line's printing helpers."""
    nb = nbformat.read(path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "schedsim.cli" not in code


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    if path.name == "quickstart.ipynb":
        text = "".join(o.get("text", "") for o in outputs)
        text += "".join(o.get("data", {}).get("text/plain", "") for o in outputs)
        assert "makespan 66" in text and "rendezvous: makespan" in text
        images = [o for o in outputs if "image/png" in o.get("data", {})]
        assert len(images) == 3          # Gantt, overlay, memory plot
