"""ct.tokens refuses what it cannot read as windows of token ids, before anything is mapped or trained, naming the
file and what is wrong with it (a token outside the vocabulary by its offset) and the fix."""

import numpy as np
import pytest

import composetrain as ct
from composetrain.data import token_files


def raw(path, values, dtype=np.uint16):
    np.array(values, dtype=dtype).tofile(path)
    return path


def test_a_raw_file_without_its_dtype_is_refused(tmp_path):
    path = raw(tmp_path / "train.bin", range(20))
    with pytest.raises(TypeError, match=r"^ct\.tokens: .*train\.bin is a raw token file, which does not say its dtype"):
        ct.tokens(path, 4)


def test_a_size_that_is_not_a_whole_number_of_tokens_is_refused(tmp_path):
    path = tmp_path / "train.bin"
    path.write_bytes(bytes(41))
    with pytest.raises(ValueError, match=r"train\.bin holds 41 bytes of tokens, not a whole number of uint16 tokens"):
        ct.tokens(path, 4, dtype=np.uint16)
    assert len(ct.tokens(path, 4, dtype=np.uint8)) == 10  # the same bytes as the dtype they are


def test_an_npy_file_named_as_raw_or_a_raw_file_named_npy_is_refused(tmp_path):
    np.save(tmp_path / "ids.npy", np.arange(20, dtype=np.uint16))
    (tmp_path / "ids.bin").write_bytes((tmp_path / "ids.npy").read_bytes())
    with pytest.raises(ValueError, match=r"ids\.bin is an \.npy file \(its header says so\).*rename it to ids\.npy"):
        ct.tokens(tmp_path / "ids.bin", 4, dtype=np.uint16)
    raw(tmp_path / "raw.npy", range(20))
    with pytest.raises(ValueError, match=r"raw\.npy is named \.npy but has no \.npy header; rename it \.bin"):
        ct.tokens(tmp_path / "raw.npy", 4)


@pytest.mark.parametrize(
    ("array", "said"),
    [
        (np.zeros((4, 6), np.uint16), r"holds an array of shape \(4, 6\), not a flat sequence of token ids"),
        (
            np.zeros(20, np.float32),
            r"'s dtype must be a NumPy integer dtype that int64 holds .* got dtype\('float32'\)",
        ),
        (np.zeros(20, np.uint64), r"'s dtype must be a NumPy integer dtype"),
        (np.zeros(20, bool), r"'s dtype must be a NumPy integer dtype"),
    ],
)
def test_an_npy_file_that_is_not_a_flat_integer_array_is_refused(tmp_path, array, said):
    np.save(tmp_path / "ids.npy", array)
    with pytest.raises((TypeError, ValueError), match=said):
        ct.tokens(tmp_path / "ids.npy", 4)


def test_an_npy_file_cut_short_or_with_bytes_appended_is_refused(tmp_path):
    path = tmp_path / "ids.npy"
    np.save(path, np.arange(20, dtype=np.uint16))
    whole = path.read_bytes()
    path.write_bytes(whole[:-2])
    with pytest.raises(ValueError, match=r"ids\.npy is 166 bytes, but its header promises 20 tokens of uint16"):
        ct.tokens(path, 4)
    path.write_bytes(whole + b"\0\0")
    with pytest.raises(ValueError, match=r"cut short or has bytes appended"):
        ct.tokens(path, 4)


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda h: h.replace(b"}", b" "), r"EOF in multi-line statement"),  # a bracket never closed
        (lambda h: h.replace(b"'shape'", b"'sh\x9bpe'"), r"Header does not contain the correct keys"),
        (lambda h: h.replace(b"(20,)", b"(2 0)"), r"Cannot parse header"),
    ],
)
def test_an_npy_file_with_a_damaged_header_is_refused_naming_it(tmp_path, damage, said):
    path = tmp_path / "ids.npy"
    np.save(path, np.arange(20, dtype=np.uint16))
    whole = path.read_bytes()
    path.write_bytes(damage(whole[:128]) + whole[128:])
    with pytest.raises(
        ValueError, match=rf"(?s)^ct\.tokens: .*ids\.npy has an \.npy header that cannot be read \(.*{said}"
    ):
        ct.tokens(path, 4)


def test_a_dtype_given_that_the_npy_header_contradicts_is_refused(tmp_path):
    np.save(tmp_path / "ids.npy", np.arange(20, dtype=np.int32))
    with pytest.raises(ValueError, match=r"dtype=uint16 was given, but .*ids\.npy is an \.npy file of int32"):
        ct.tokens(tmp_path / "ids.npy", 4, dtype=np.uint16)
    assert len(ct.tokens(tmp_path / "ids.npy", 4, dtype=np.int32)) == 4


@pytest.mark.parametrize("dtype", [np.float32, "float16", bool, np.uint64, "nonsense", object, None.__class__])
def test_a_dtype_that_is_not_an_integer_type_int64_holds_is_refused(tmp_path, dtype):
    path = raw(tmp_path / "train.bin", range(20))
    with pytest.raises(TypeError, match=r"^ct\.tokens: dtype must be a NumPy integer dtype that int64 holds .*got "):
        ct.tokens(path, 4, dtype=dtype)


def test_an_empty_file_and_one_shorter_than_a_window_are_refused_naming_them(tmp_path):
    (tmp_path / "empty.bin").write_bytes(b"")
    raw(tmp_path / "ok.bin", range(20))
    with pytest.raises(ValueError, match=r"empty\.bin holds no tokens \(an empty shard\): leave it out of paths"):
        ct.tokens([tmp_path / "ok.bin", tmp_path / "empty.bin"], 4, dtype=np.uint16)
    raw(tmp_path / "short.bin", range(8))
    with pytest.raises(ValueError, match=r"short\.bin holds 8 token\(s\), fewer than one window of seq_len \+ 1 = 9: "):
        ct.tokens([tmp_path / "ok.bin", tmp_path / "short.bin"], 8, dtype=np.uint16)
    assert len(ct.tokens(tmp_path / "short.bin", 7, dtype=np.uint16)) == 1  # the fix it names: seq_len at most 7
    raw(tmp_path / "one.bin", [5])
    with pytest.raises(ValueError, match=r"one\.bin holds 1 token\(s\), fewer than one window .* = 2: join it with"):
        ct.tokens(tmp_path / "one.bin", 1, dtype=np.uint16)


@pytest.mark.parametrize("chunk", [7, 1 << 22])
def test_a_token_outside_the_vocabulary_is_refused_by_file_and_offset(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(token_files, "CHUNK", chunk)  # found in a later chunk as in the first
    values = np.arange(30, dtype=np.uint16) % 10
    values[23] = 10
    path = raw(tmp_path / "train.bin", values)
    raw(tmp_path / "first.bin", range(10))
    with pytest.raises(ValueError, match=r"train\.bin holds the token 10 at token 23 \(byte 46\), outside the voc"):
        ct.tokens([tmp_path / "first.bin", path], 4, dtype=np.uint16, vocab_size=10)
    assert len(ct.tokens([tmp_path / "first.bin", path], 4, dtype=np.uint16, vocab_size=11)) == 2 + 7


def test_a_negative_token_is_outside_the_vocabulary(tmp_path):
    np.save(tmp_path / "ids.npy", np.array([3, 1, -1, 2, 0, 1], np.int32))
    with pytest.raises(ValueError, match=r"ids\.npy holds the token -1 at token 2 \(byte 136\)"):
        ct.tokens(tmp_path / "ids.npy", 2, vocab_size=5)
    assert len(ct.tokens(tmp_path / "ids.npy", 2)) == 2  # unchecked without vocab_size


def test_paths_that_are_missing_a_folder_or_the_same_file_twice_are_refused(tmp_path):
    path = raw(tmp_path / "train.bin", range(20))
    with pytest.raises(FileNotFoundError, match=r"^ct\.tokens: no file at .*nothere\.bin; give the path of a token"):
        ct.tokens([path, tmp_path / "nothere.bin"], 4, dtype=np.uint16)
    with pytest.raises(ValueError, match=r"is a folder; give the token files themselves"):
        ct.tokens(tmp_path, 4, dtype=np.uint16)
    (tmp_path / "link.bin").symlink_to(path)
    with pytest.raises(ValueError, match=r"names the file .*train\.bin twice \(also as .*link\.bin\)"):
        ct.tokens([path, tmp_path / "link.bin"], 4, dtype=np.uint16)


@pytest.mark.parametrize("paths", [[], (), 3, None, [b"train.bin"], {"a": 1}])
def test_paths_of_another_kind_are_refused(paths):
    with pytest.raises(TypeError, match=r"^ct\.tokens: paths must be a path or a non-empty list of paths, got "):
        ct.tokens(paths, 4, dtype=np.uint16)


def test_seq_len_and_vocab_size_follow_the_rule_for_ints(tmp_path):
    path = raw(tmp_path / "train.bin", range(20))
    with pytest.raises(ValueError, match=r"^ct\.tokens: seq_len must be a positive int, got 0 \(int\)"):
        ct.tokens(path, 0, dtype=np.uint16)
    with pytest.raises(TypeError, match=r"^ct\.tokens: seq_len must be a positive int, got 4\.0 \(float\)"):
        ct.tokens(path, 4.0, dtype=np.uint16)
    with pytest.raises(ValueError, match=r"^ct\.tokens: vocab_size must be a positive int, got 0 \(int\)"):
        ct.tokens(path, 4, dtype=np.uint16, vocab_size=0)
