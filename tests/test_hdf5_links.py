"""ct.hdf5 where a dataset's rows come from elsewhere: a virtual dataset's sources and external links. A source or
link target that is missing is refused naming the file (h5py would read a virtual dataset's fill value as its rows,
and a dangling link reads as "no such dataset"); present ones are read, and checked for change like the file."""

import numpy as np
import pytest

import composetrain as ct

h5py = pytest.importorskip("h5py")

ROWS = np.arange(12, dtype="<f8").reshape(4, 3)


def virtual(folder, sources, fill=-1.0):
    """``folder/v.h5`` with the virtual dataset "v": the rows of each (file, name) source in turn, 4 each."""
    layout = h5py.VirtualLayout(shape=(4 * len(sources), 3), dtype="<f8")
    for n, (file, name) in enumerate(sources):
        layout[4 * n : 4 * n + 4] = h5py.VirtualSource(file, name, shape=(4, 3))
    with h5py.File(folder / "v.h5", "a") as f:
        f["own"] = 100 + ROWS
        f.create_virtual_dataset("v", layout, fillvalue=fill)
    return folder / "v.h5"


def source(path, name="a", rows=ROWS):
    with h5py.File(path, "a") as f:
        f[name] = rows
    return path


def test_a_virtual_dataset_whose_sources_are_there_reads_their_rows_from_any_folder(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    source(tmp_path / "sub" / "one.h5")
    source(tmp_path / "sub" / "two.h5", "b", -ROWS)
    path = virtual(tmp_path / "sub", [("one.h5", "a"), ("two.h5", "b"), (".", "own")])
    monkeypatch.chdir(tmp_path)  # relative sources lie beside the virtual file, not in the working folder
    data = ct.hdf5(path, "v")
    assert data.read_by_h5py == ["v"]
    index = [11, 0, 5, 5, 8]
    assert data.read_batch(index).tolist() == np.concatenate([ROWS, -ROWS, 100 + ROWS])[index].tolist()


def test_a_virtual_dataset_whose_source_file_is_missing_is_refused_naming_it(tmp_path):
    source(tmp_path / "one.h5")
    (tmp_path / "other").mkdir()
    path = virtual(tmp_path, [("one.h5", "a"), ("gone.h5", "a")])
    with h5py.File(path, "r") as f:
        assert (f["v"][4:] == -1).all()  # what h5py hands out for the missing rows: the fill value
    with pytest.raises(FileNotFoundError, match=r"ct\.hdf5: '/v' in .*v\.h5 is a virtual dataset .*'gone\.h5'"):
        ct.hdf5(path, "v")
    with pytest.raises(FileNotFoundError, match=r"'/v' .* from 'zz' in .*one\.h5, which has no such dataset"):
        ct.hdf5(virtual(tmp_path / "other", [(str(tmp_path / "one.h5"), "a"), (str(tmp_path / "one.h5"), "zz")]), "v")


def test_a_virtual_datasets_source_changed_after_ct_hdf5_is_refused_at_the_first_read(tmp_path):
    source(tmp_path / "one.h5")
    data = ct.hdf5(virtual(tmp_path, [("one.h5", "a")]), "v")
    (tmp_path / "one.h5").unlink()
    source(tmp_path / "one.h5", rows=-ROWS)
    with pytest.raises(RuntimeError, match=r"ct\.hdf5: .*one\.h5 changed since ct\.hdf5 opened it"):
        data.read_batch([0])


def test_a_dangling_link_is_named_with_its_missing_file_or_target(tmp_path):
    source(tmp_path / "one.h5")
    with h5py.File(source(tmp_path / "one.h5", "g/x"), "a"):
        pass
    path = tmp_path / "main.h5"
    with h5py.File(path, "w") as f:
        f["x"] = ROWS
        f["ext"] = h5py.ExternalLink("gone.h5", "x")
        f["group"] = h5py.ExternalLink("gone.h5", "g")
        f["nothing"] = h5py.ExternalLink("one.h5", "nothing")
        f["soft"] = h5py.SoftLink("/nowhere")
    cases = {
        "ext": r"'ext' is an external link to 'x' in the file 'gone\.h5', which is not there",
        "group/x": r"'group' is an external link to 'g' in the file 'gone\.h5', which is not there",
        "nothing": r"'nothing' is an external link to 'nothing' in .*one\.h5, which has no such object",
        "soft": r"'soft' is a soft link to '/nowhere', which is not in the file",
    }
    for name, match in cases.items():
        with pytest.raises(FileNotFoundError, match=rf"ct\.hdf5: '{name}' in .*main\.h5: {match}"):
            ct.hdf5(path, name)
    with pytest.raises(KeyError, match=r"'missing' in .*no such dataset"):  # no link at all: as before
        ct.hdf5(path, "missing")
    assert ct.hdf5(path, ["x"]).read_batch([1])[0].tolist() == [ROWS[1].tolist()]
