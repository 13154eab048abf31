"""The planted bugs of src/composetrain/core/tokens.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "return (labels[..., 1:] != self.ignore_index).sum()",
        "replace": "return (labels != self.ignore_index).sum()",
        "tests": [
            "tests/test_shifted_tokens.py::test_accumulate_with_shifted_tokens_is_the_textbook_large_batch_update",
        ],
        "why": "25.1: the first label of each sequence counted, which the shifted loss never predicts",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "return (labels[..., 1:] != self.ignore_index).sum()",
        "replace": "return (labels[..., :-1] != self.ignore_index).sum()",
        "tests": [
            "tests/test_shifted_tokens.py::test_accumulate_with_shifted_tokens_is_the_textbook_large_batch_update",
        ],
        "why": "25.2: the shift taken at the wrong end: the last label dropped instead of the first",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "return (labels[..., 1:] != self.ignore_index).sum()",
        "replace": "return (labels[..., 1:] != -100).sum()",
        "tests": [
            "tests/test_shifted_tokens.py::test_tuple_batches_take_an_index_and_other_ignore_indices",
        ],
        "why": "25.3: ignore_index accepted and then ignored: -100 hard-coded",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "if labels.dim() < 2:",
        "replace": "if labels.dim() < 1:",
        "tests": [
            "tests/test_shifted_tokens.py::test_a_batch_without_usable_labels_is_refused_naming_the_fix",
        ],
        "why": "25.4: 1-D labels accepted: the shift then runs across the batch, not along a sequence",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "if isinstance(labels_key, bool) or not isinstance(labels_key, (str, numbers.Integral)):",
        "replace": "if not isinstance(labels_key, (str, numbers.Integral)):",
        "tests": [
            "tests/test_shifted_tokens.py::test_bad_arguments_are_refused_when_built",
        ],
        "why": "25.5: True taken as index 1 (bool is an int subclass)",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "if -len(batch) <= self.key < len(batch):",
        "replace": "if -len(batch) <= self.key <= len(batch):",
        "tests": [
            "tests/test_shifted_tokens.py::test_a_batch_without_usable_labels_is_refused_naming_the_fix",
        ],
        "why": "25.6: off by one: an index one past the tuple raises a bare IndexError, not the fix",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:",
        "replace": "if labels.is_complex() or labels.dtype == torch.bool:",
        "tests": [
            "tests/test_shifted_tokens.py::test_a_batch_without_usable_labels_is_refused_naming_the_fix",
        ],
        "why": "25.7: float labels (logits or probabilities given by mistake) counted as tokens",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:",
        "replace": "if labels.is_floating_point() or labels.is_complex():",
        "tests": [
            "tests/test_shifted_tokens.py::test_a_batch_without_usable_labels_is_refused_naming_the_fix",
        ],
        "why": "25.14: bool labels (a mask given for the labels) counted: every position, since True != -100",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": 'if "num_items_in_batch" in batch:',
        "replace": 'if self.key not in batch and "num_items_in_batch" in batch:',
        "tests": [
            "tests/test_hf.py::test_a_batch_holding_num_items_in_batch_is_refused_by_shifted_tokens",
        ],
        "why": "25.15: num_items_in_batch looked for only when the labels are missing: the loss divided twice",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": 'if "num_items_in_batch" in batch:',
        "replace": 'if "num_items_in_batch" in batch and isinstance(batch["num_items_in_batch"], torch.Tensor):',
        "tests": [
            "tests/test_hf.py::test_a_batch_holding_num_items_in_batch_is_refused_by_shifted_tokens",
        ],
        "why": "25.16: only a tensor num_items_in_batch refused; transformers divides by an int as well",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "labels.is_complex() or labels.dtype == torch.bool:",
        "replace": "labels.is_complex() or labels.dtype == torch.uint8:",
        "tests": [
            "tests/test_shifted_tokens.py::test_a_batch_without_usable_labels_is_refused_naming_the_fix",
        ],
        "why": "25.20: the byte type refused for bool (a mask given for the labels)",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "            if -len(batch) <= self.key < len(batch):",
        "replace": "            if 0 <= self.key < len(batch):",
        "tests": [
            "tests/test_shifted_tokens.py::test_a_negative_index_finds_the_labels_as_indexing_the_batch_does",
        ],
        "why": "30.7: shifted_tokens(-1) refused although batch[-1] holds the labels",
        "from": "issue29_check",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "            if -len(batch) <= self.key < len(batch):",
        "replace": "            if self.key < len(batch):",
        "tests": [
            "tests/test_shifted_tokens.py::test_a_negative_index_finds_the_labels_as_indexing_the_batch_does",
        ],
        "why": "30.7: a negative index past the batch escapes as Python's bare IndexError",
        "from": "issue29_check",
    },
]
