"""The planted bugs of tests/time_limit.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "tests/time_limit.py",
        "find": '    with _limited(item, "setup"):',
        "replace": '    with _limited(item, "call"):',
        "tests": [
            "tests/test_processes.py::test_a_hanging_test_fails_naming_itself_and_its_phase_and_a_stuck_one_ends_the_session",
        ],
        "why": "a hang in a fixture is reported as one in the test's call",
        "from": "issue29_launch",
    },
    {
        "file": "tests/time_limit.py",
        "find": '        _stderr.write(f"\\n{message}\\n")  # in the log at once, whatever ends the session later\n',
        "replace": "",
        "tests": [
            "tests/test_processes.py::test_a_hanging_test_fails_naming_itself_and_its_phase_and_a_stuck_one_ends_the_session",
        ],
        "why": "a timed-out test is named only in the final summary, which a stuck session never prints",
        "from": "issue29_launch",
    },
    {
        "file": "tests/time_limit.py",
        "find": "        watchdog.cancel()",
        "replace": "        pass",
        "tests": [
            "tests/test_processes.py::test_a_hanging_test_fails_naming_itself_and_its_phase_and_a_stuck_one_ends_the_session",
        ],
        "why": "a phase's watchdog outlives it and ends the session during a later test",
        "from": "issue29_launch",
    },
    {
        "file": "tests/time_limit.py",
        "find": "    os._exit(STATUS)",
        "replace": "    os._exit(0)",
        "tests": [
            "tests/test_processes.py::test_a_hanging_test_fails_naming_itself_and_its_phase_and_a_stuck_one_ends_the_session",
        ],
        "why": "a session ended by the watchdog reports success",
        "from": "issue29_launch",
    },
    {
        "file": "tests/time_limit.py",
        "find": "    signal.setitimer(signal.ITIMER_REAL, limit)",
        "replace": "    signal.setitimer(signal.ITIMER_REAL, limit + grace + 1)",
        "tests": [
            "tests/test_processes.py::test_a_hanging_test_fails_naming_itself_and_its_phase_and_a_stuck_one_ends_the_session",
        ],
        "why": "SIGALRM comes after the watchdog: every hang ends the whole session",
        "from": "issue29_launch",
    },
]
