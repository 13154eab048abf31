"""The planted bugs of src/composetrain/driver/tracking.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "            returned = self.on_record(copy.deepcopy(record))",
        "replace": "            returned = self.on_record(record)",
        "tests": [
            "tests/test_run_tracker.py::test_every_record_reaches_the_tracker_once_as_the_metrics_file_holds_it",
        ],
        "why": "24.5: the tracker gets the history's own record, and what it changes there changes the history",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": 'or (record["step"], "eval" in record) in self.sent:',
        "replace": 'or (record["step"], "eval" not in record) in self.sent:',
        "tests": [
            "tests/test_run_tracker.py::test_after_a_crash_the_redone_updates_do_not_send_their_records_again",
        ],
        "why": "24.5: a training and an evaluation record of one step mistaken for each other",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": 'self.sent.add((record["step"], isinstance(record.get("eval"), dict)))',
        "replace": 'self.sent.add((record["step"], False))',
        "tests": [
            "tests/test_run_tracker.py::test_after_a_crash_the_redone_updates_do_not_send_their_records_again",
        ],
        "why": "24.5: the evaluations found in the file counted as training records: the resumed run resends them",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "            self.failed = (record, e)",
        "replace": "            raise",
        "tests": [
            "tests/test_run_tracker.py::test_a_tracker_that_raises_stops_the_run_saved_and_the_error_names_the_record",
        ],
        "why": "24.5: the tracker's exception escapes at once: no save, no word of which record",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": ("    while isinstance(fn, functools.partial):\n        fn = fn.func\n"),
        "replace": "",
        "tests": [
            "tests/test_run_tracker.py::test_a_tracker_whose_call_runs_nothing_is_refused_before_anything_runs",
        ],
        "why": "a-recipes: a partial of an async function not unwrapped: every record lost without a word",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": '    for target in (fn, inspect.getattr_static(type(fn), "__call__", None)):',
        "replace": "    for target in (fn,):",
        "tests": [
            "tests/test_run_tracker.py::test_a_tracker_whose_call_runs_nothing_is_refused_before_anything_runs",
        ],
        "why": "a-recipes: an object with an async __call__ taken as a plain function",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "            if kind is not None:  # nothing of it ran",
        "replace": "            if False:  # nothing of it ran",
        "tests": [
            "tests/test_run_tracker.py::test_a_tracker_that_returns_a_generator_stops_the_run_and_says_why",
        ],
        "why": "a-recipes: a tracker returning a generator at run time: its records silently never tracked",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "            self.sent.update((s, e) for s, e in pairs if type(s) is int and type(e) is bool)\n",
        "replace": "            pass\n",
        "tests": [
            "tests/test_run_tracker.py::test_any_number_of_crashes_at_any_updates_sends_each_record_once",
            "tests/test_run_tracker.py::test_each_record_reaches_the_tracker_once_across_runs_killed_again_and_again",
        ],
        "why": "29.9: what earlier resumed runs found sent is forgotten: a second kill sends the records again",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "self.sent = {(s, e) for s, e in self.sent if s >= step}",
        "replace": "self.sent = {(s, e) for s, e in self.sent if s > step}",
        "tests": [
            "tests/test_run_tracker.py::test_any_number_of_crashes_at_any_updates_sends_each_record_once",
            "tests/test_run_tracker.py::test_after_a_crash_the_redone_updates_do_not_send_their_records_again",
        ],
        "why": "29.9: the evaluation at the checkpoint's own step (redone on resume) is dropped from what was sent",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "        except (Exception, KeyboardInterrupt, SystemExit) as e:",
        "replace": "        except Exception as e:",
        "tests": [
            "tests/test_run_tracker.py::test_a_tracker_raising_keyboardinterrupt_or_systemexit_stops_the_run_saved_and_raises_it",
        ],
        "why": "29 unclear: a tracker's KeyboardInterrupt ends the run unsaved",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "        if self.on_record is None or seconds < 0.5 * timeout:",
        "replace": "        if self.on_record is None or seconds < 5 * timeout:",
        "tests": [
            "tests/test_run_tracker.py::test_a_tracker_blocking_past_the_timeout_on_two_ranks_is_named_by_both",
        ],
        "why": "29 unclear: rank 0's error blames a hung rank, not its slow tracker",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "            pairs = [p for p in earlier if type(p) is list and len(p) == 2]\n",
        "replace": "            pairs = earlier\n",
        "tests": [
            "tests/test_run_tracker.py::test_a_damaged_list_of_sent_records_is_read_as_far_as_it_holds_pairs",
        ],
        "why": "a damaged .metrics.jsonl.sent ([[5, true, 1]], [5]) raises ValueError/TypeError after the resume",
        "from": "issue29_x_run",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": (
            "            except (ValueError, RecursionError):  # a line cut short by a crash: sent again (its "
            "call returned)\n"
        ),
        "replace": "            except ValueError:\n",
        "tests": [
            "tests/test_run_tracker.py::test_a_metrics_line_nested_too_deep_for_json_counts_as_cut_short",
        ],
        "why": "a metrics line of [[[[... raises RecursionError out of ct.run on resume",
        "from": "issue29_x_run",
    },
]
