"""The planted bugs of src/composetrain/data/packing.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/data/packing.py",
        "find": "        return index % len(self)",
        "replace": "        return index",
        "tests": [
            "tests/test_pack.py::test_rows_are_indexed_as_a_list_is_and_anything_else_is_refused",
        ],
        "why": "a negative row indexes alone but not read whole (index_select refuses it)",
        "from": "adv33",
    },
    {
        "file": "src/composetrain/data/packing.py",
        "find": "whole = not isinstance(i, bool | np.bool_) and not (",
        "replace": "whole = not (",
        "tests": [
            "tests/test_pack.py::test_rows_are_indexed_as_a_list_is_and_anything_else_is_refused",
        ],
        "why": "True indexes row 1 (a bool is an int to operator.index)",
        "from": "adv33",
    },
    {
        "file": "src/composetrain/data/packing.py",
        "find": "following = doc[start + 1 : start + length + 1]",
        "replace": "following = doc[start + 1 : start + length]",
        "tests": [
            "tests/test_pack.py::test_a_document_longer_than_seq_len_is_refused_unless_split_and_split_keeps_its_next_token_labels",
        ],
        "why": "a split piece's last token loses its label (the next token of the same document)",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/packing.py",
        "find": 'rows["position_ids"][row, column:end] = np.arange(length)',
        "replace": 'rows["position_ids"][row, column:end] = np.arange(column, end)',
        "tests": [
            "tests/test_pack.py::test_every_token_is_placed_once_and_labels_never_cross_a_document",
            "tests/test_pack_gpt.py::test_a_packed_batch_gives_each_document_the_losses_and_gradients_it_has_alone",
        ],
        "why": "positions count from the row's start, not the document's",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/packing.py",
        "find": "i = 2 * i if room[2 * i] >= length else 2 * i + 1",
        "replace": "i = 2 * i if room[2 * i] > length else 2 * i + 1",
        "tests": [
            "tests/test_pack.py::test_first_fit_puts_each_piece_in_the_first_row_with_room_and_greedy_in_the_last",
        ],
        "why": "first fit skips a row the piece fits exactly",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/packing.py",
        "find": "            if used + length > seq_len:",
        "replace": "            if used + length >= seq_len:",
        "tests": [
            "tests/test_pack.py::test_first_fit_puts_each_piece_in_the_first_row_with_room_and_greedy_in_the_last",
        ],
        "why": "greedy opens a new row for a piece that fills the current one exactly",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/packing.py",
        "find": 'rows["document_ids"][row, column:end] = n',
        "replace": 'rows["document_ids"][row, column:end] = row',
        "tests": [
            "tests/test_pack.py::test_every_token_is_placed_once_and_labels_never_cross_a_document",
            "tests/test_pack_gpt.py::test_a_packed_batch_gives_each_document_the_losses_and_gradients_it_has_alone",
        ],
        "why": "one id per row: the mask lets every document of a row attend to the others",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/packing.py",
        "find": '"labels": np.full((count, seq_len), IGNORE, np.int64),',
        "replace": '"labels": np.full((count, seq_len), pad_id, np.int64),',
        "tests": [
            "tests/test_pack.py::test_every_token_is_placed_once_and_labels_never_cross_a_document",
        ],
        "why": "padding and each document's last token predict the pad id (the next document's first token: 0)",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/packing.py",
        "find": "        if len(doc) > seq_len and not split:",
        "replace": "        if len(doc) >= seq_len and not split:",
        "tests": [
            "tests/test_pack.py::test_a_document_of_exactly_seq_len_tokens_fills_a_row_unsplit",
        ],
        "why": "a document that fills a row exactly is refused as too long",
        "from": "tokens",
    },
]
