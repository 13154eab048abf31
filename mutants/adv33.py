"""Planted bugs of the adversary pass on issue 33 (token files, the token writer, packing, document masks, streams in
ct.run), replayed by tools/mutants.py; tools/regroup_mutants.py files each into its module's catalogue."""

MUTANTS = [
    {
        "file": "src/composetrain/data/token_files.py",
        "find": "except (KeyError, ValueError, SyntaxError, tokenize.TokenError) as e:",
        "replace": "except (KeyError, ValueError, SyntaxError) as e:",
        "tests": ["tests/test_tokens_refusals.py::test_an_npy_file_with_a_damaged_header_is_refused_naming_it"],
        "why": "a header cut inside a bracket raises tokenize's bare TokenError, naming no file",
    },
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": "    if low < 0:  # no dtype holds it as a token: a wider one is no fix",
        "replace": "    if low < -1:  # no dtype holds it as a token: a wider one is no fix",
        "tests": ["tests/test_write_tokens.py::test_an_id_the_dtype_cannot_hold_changes_nothing"],
        "why": "-1 (a padding or end id of some tokenizers) written as 65535 into a uint16 file",
    },
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": "    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):",
        "replace": "    if not os.access(target, os.W_OK):",
        "tests": ["tests/test_write_tokens.py::test_a_file_nobody_may_write_is_not_appended_to"],
        "why": "read-only judged by os.access, which says writable to root: a protected shard is replaced",
    },
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": 'pattern = re.compile(rf"\\.{re.escape(target.name)}\\.\\d+\\.[0-9a-f]{{8}}\\.tmp")',
        "replace": 'pattern = re.compile(rf"\\.{re.escape(target.name)}.*\\.tmp")',
        "tests": [
            "tests/test_write_tokens.py::test_a_killed_writers_temporary_file_is_removed_by_the_next_write_and_nothing_else"
        ],
        "why": "leftovers matched too loosely: a file of the user's named like a temporary is deleted",
    },
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": "                    ours = False\n",
        "replace": "                    ours = True\n",
        "tests": [
            "tests/test_write_tokens.py::test_a_folder_it_may_not_write_is_named_and_a_callers_own_os_error_passes_as_it_came"
        ],
        "why": "the caller's own OSError (its tokenizer's full cache) relabelled as the writer's full disk",
    },
    {
        "file": "src/composetrain/data/token_writer.py",
        "find": "    errno.EFBIG: _FULL,  # a file size limit (ulimit -f)\n",
        "replace": "",
        "tests": ["tests/test_write_tokens.py::test_a_full_disk_is_named_with_the_file_and_changes_nothing"],
        "why": "a file size limit (ulimit -f, EFBIG) raises a bare OSError naming no function",
    },
    {
        "file": "src/composetrain/data/packing.py",
        "find": "        return index % len(self)",
        "replace": "        return index",
        "tests": ["tests/test_pack.py::test_rows_are_indexed_as_a_list_is_and_anything_else_is_refused"],
        "why": "a negative row indexes alone but not read whole (index_select refuses it)",
    },
    {
        "file": "src/composetrain/data/packing.py",
        "find": "whole = not isinstance(i, bool | np.bool_) and not (",
        "replace": "whole = not (",
        "tests": ["tests/test_pack.py::test_rows_are_indexed_as_a_list_is_and_anything_else_is_refused"],
        "why": "True indexes row 1 (a bool is an int to operator.index)",
    },
    {
        "file": "src/composetrain/data/document_masks.py",
        "find": "    rows = (ids if ids.ndim == 2 else ids.unsqueeze(0)).clone()",
        "replace": "    rows = ids if ids.ndim == 2 else ids.unsqueeze(0)",
        "tests": ["tests/test_pack.py::test_the_block_mask_keeps_the_ids_it_was_built_from"],
        "why": "the block mask's mask_mod reads a reused buffer's later ids while its skipped blocks stay the old ones",
    },
    {
        "file": "src/composetrain/driver/streams.py",
        "find": "        if self.loader is not None and not self.opened and has_state(self.dataset):",
        "replace": "        if False:",
        "tests": [
            "tests/test_streams_torchdata.py::test_loader_workers_start_after_set_epoch_also_when_checkpoints_are_saved"
        ],
        "why": "the check before the first update starts the loader's workers before set_epoch(0)",
    },
    {
        "file": "src/composetrain/driver/streams.py",
        "find": 'derive_seed(self.seed, "stream pass", rank=self.rank, epoch=self.epoch)',
        "replace": 'derive_seed(self.seed, "stream pass", rank=self.rank)',
        "tests": [
            "tests/test_streams_torchdata.py::test_a_pass_read_by_workers_ct_run_builds_draws_alike_in_a_resumed_run"
        ],
        "why": "every pass's workers seeded alike: each pass's noise repeats the first pass's",
    },
    {
        "file": "src/composetrain/driver/streams.py",
        "find": 'if getattr(data, "in_order", True) is False and data.num_workers > 1:',
        "replace": 'if getattr(data, "in_order", True) is False and data.num_workers > 2:',
        "tests": [
            "tests/test_streams_torchdata.py::test_a_stateful_dataloader_out_of_order_is_refused_with_checkpoints"
        ],
        "why": "two workers out of order are let through: a resume trains on other batches",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "            and data.persistent_workers\n",
        "replace": "",
        "tests": [
            "tests/test_streams.py::test_persistent_workers_that_would_never_see_set_epoch_are_refused_for_several_passes"
        ],
        "why": "every loader with workers refused for several passes, also those that start their workers each pass",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '            self.settings["num_workers"] = self.stream.num_workers\n',
        "replace": "",
        "tests": [
            "tests/test_streams_torchdata.py::test_a_stream_resumed_with_another_number_of_workers_is_refused_before_anything_changes"
        ],
        "why": "a stream's state of 2 workers handed to 0 or 1: a misleading error after the model was loaded",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": "STREAM_STATES = (dict, OrderedDict)",
        "replace": "STREAM_STATES = (dict,)",
        "tests": ["tests/test_streams.py::test_a_state_dict_returned_as_an_ordered_dict_is_saved_and_resumed"],
        "why": "an OrderedDict state refused as 'not a dict', though it loads with weights_only as it was",
    },
    {
        "file": "src/composetrain/driver/stream_passes.py",
        "find": 'return stream.record(state), {"state": state, "ended": any_true(stream.ended) if inside else False}',
        "replace": 'return stream.record(state), {"state": state, "ended": False}',
        "tests": [
            "tests/test_streams_ranks.py::test_a_global_stream_saved_after_its_last_short_batch_resumes_on_another_number_of_processes_at_the_pass_end"
        ],
        "why": "on another world size, a global stream that starts over by itself is read again in the pass it ended",
    },
    {
        "file": "src/composetrain/driver/stream_passes.py",
        "find": "batches = _raising(e)",
        "replace": "raise",
        "tests": [
            "tests/test_streams_ranks.py::test_a_stream_failing_in_iter_set_epoch_or_set_rank_on_one_rank_fails_every_rank_at_once"
        ],
        "why": "an iter() or set_epoch raising on one rank leaves the others at the next collective (a hang)",
    },
]
