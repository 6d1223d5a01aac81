"""real_fae_core.atomicio: files appear under their final name only when complete."""

from __future__ import annotations

import json

import pytest

from real_fae_core.atomicio import atomic_file, atomic_open, atomic_write_json


def test_atomic_file_keeps_the_suffix_for_writers_that_pick_a_format_by_name(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = tmp_path / "fig.svg"
    with atomic_file(path) as tmp:
        assert tmp.name.endswith(".tmp.svg") and tmp.parent == tmp_path
        fig.savefig(tmp)  # the format comes from the name: svg, not the default png
        assert not path.exists()
    plt.close(fig)
    assert path.read_text().lstrip().startswith("<?xml") and "<svg" in path.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.svg"]


def test_a_failed_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "states.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_file(path) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("killed mid-write")
    with pytest.raises(ValueError), atomic_open(path, "wb") as fh:
        assert fh.name.endswith(".tmp")  # the temporary's name as docs/errors.md gives it: .NAME.PID.*.tmp
        fh.write(b"half")
        raise ValueError("bad record")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["states.bin"]


@pytest.mark.parametrize("kwargs", [{}, {"ensure_ascii": False}, {"sort_keys": True}])
def test_atomic_write_json_is_indented_json_with_a_final_newline(tmp_path, kwargs):
    obj = {"b": [1, 2.5, None], "a": "Überprüfung ✓"}
    atomic_write_json(tmp_path / "x.json", obj, **kwargs)
    text = (tmp_path / "x.json").read_text(encoding="utf-8")
    assert text == json.dumps(obj, indent=2, **kwargs) + "\n"
    assert json.loads(text) == obj
    assert ("✓" in text) == (kwargs.get("ensure_ascii") is False)
