"""ct.hdf5 where a dataset's rows come from elsewhere: a virtual dataset's sources and external links. A source or
link target that is missing is refused naming the file (h5py would read a virtual dataset's fill value as its rows,
and a dangling link reads as "no such dataset"); present ones are read, and checked for change like the file."""

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import composetrain as ct
from composetrain.data.equal import same_item

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


# -- a relative link or source found again after a change of folder or a new file beside it ----------------------


def _external(tmp_path: Path, monkeypatch: Any) -> tuple[Path, Path]:
    """main/main.h5 whose 'x' (chunked, read by h5py) and 'c' (contiguous, mapped) are external links to the
    relative 'part.h5', found through the working folder a/ (no part.h5 beside main.h5); b/part.h5 another file
    of that name."""
    for sub, value in (("a", 1.0), ("b", 2.0), ("main", None)):
        (tmp_path / sub).mkdir()
        if value is not None:
            with h5py.File(tmp_path / sub / "part.h5", "w") as f:
                f.create_dataset("x", data=np.full((8, 2), value, np.float32), chunks=(2, 2), compression="gzip")
                f.create_dataset("c", data=np.full((8, 2), value, np.float32))
    main = tmp_path / "main" / "main.h5"
    with h5py.File(main, "w") as f:
        f["x"] = h5py.ExternalLink("part.h5", "/x")
        f["c"] = h5py.ExternalLink("part.h5", "/c")
    monkeypatch.chdir(tmp_path / "a")
    return main, tmp_path / "b" / "part.h5"


@pytest.mark.parametrize("change", ["a file of that name appears beside main.h5", "the process changes folder"])
def test_rows_behind_an_external_link_come_from_the_file_ct_hdf5_found(
    tmp_path: Path, monkeypatch: Any, change: str
) -> None:
    """The bug (rows of another file served, mixed with the right file's, no refusal): a mapped dataset behind an
    external link is read from the file ``ct.hdf5`` found (``file_of``, stamped), but one h5py reads goes through
    the link again at every batch (``opened()[key]``), and HDF5 resolves a relative link anew each time: after a
    ``chdir``, or once a file of that name appears beside the linking file, 'x' comes from b/part.h5 while 'c' still
    comes from a/part.h5: items (2., 1.) that neither file holds. The fix: read h5py's datasets from the file the
    link led to when ``ct.hdf5`` opened it (open ``file_of(dset)``, read ``dset.name`` there), or refuse when the
    link now resolves elsewhere."""
    main, other = _external(tmp_path, monkeypatch)
    data = ct.hdf5(main, ["x", "c"])
    first = data.read_batch([0, 1])
    assert float(first[0][0, 0]) == 1.0 and float(first[1][0, 0]) == 1.0
    if change == "the process changes folder":
        monkeypatch.chdir(other.parent)
    else:
        other.rename(main.parent / "part.h5")
    try:
        again = data.read_batch([0, 1])
    except (RuntimeError, ValueError, FileNotFoundError):
        return  # refused: fine
    assert same_item(again, first), f"'x' now reads {again[0][0].tolist()}, 'c' {again[1][0].tolist()}"


@pytest.mark.parametrize("change", ["a file of that name appears beside main.h5", "the process changes folder"])
def test_rows_of_a_virtual_dataset_come_from_the_sources_ct_hdf5_checked(
    tmp_path: Path, monkeypatch: Any, change: str
) -> None:
    """The bug (rows of another file served, no refusal): ``virtual_files`` finds a virtual dataset's relative source
    (here through the working folder) and stamps that file, but h5py resolves the source again at every read: after
    a ``chdir``, or once a file of that name appears beside the virtual dataset's file, the rows come from that
    other file while the stamped one is unchanged. The fix: refuse at a read when a source now resolves to another
    file than the stamped one (``_found`` again, one ``isfile`` per source), or pin HDF5's virtual prefix to the
    folder found."""
    for sub, value in (("a", 1.0), ("b", 2.0), ("main", None)):
        (tmp_path / sub).mkdir()
        if value is not None:
            with h5py.File(tmp_path / sub / "part.h5", "w") as f:
                f.create_dataset("x", data=np.full((8, 2), value, np.float32))
    layout = h5py.VirtualLayout(shape=(8, 2), dtype=np.float32)
    layout[:] = h5py.VirtualSource("part.h5", "x", shape=(8, 2))
    main = tmp_path / "main" / "main.h5"
    with h5py.File(main, "w") as f:
        f.create_virtual_dataset("v", layout, fillvalue=-1)
    monkeypatch.chdir(tmp_path / "a")
    data = ct.hdf5(main, "v")
    first = data.read_batch([0])
    assert float(first[0, 0]) == 1.0
    if change == "the process changes folder":
        monkeypatch.chdir(tmp_path / "b")
    else:
        (tmp_path / "b" / "part.h5").rename(main.parent / "part.h5")
    try:
        again = data.read_batch([0])
    except (RuntimeError, ValueError, FileNotFoundError):
        return
    assert same_item(again, first), f"rows now read {again.tolist()}, from a file ct.hdf5 never checked"
