"""Planted bugs for issue 29 item 14 (the tests' process harness, the time limit, the rendezvous message)."""

P = "tests/test_processes.py"
DIES = f"{P}::test_a_pool_whose_rank_dies_mid_call_fails_at_once_and_for_every_later_call"
JOIN = f"{P}::test_a_pool_whose_rank_dies_before_joining_names_the_rendezvous"
LEAVE = f"{P}::test_a_pool_whose_rank_will_not_leave_fails_its_teardown_and_is_killed"
HANG = f"{P}::test_a_pool_whose_rank_hangs_is_killed_on_timeout"
LIMIT = f"{P}::test_a_hanging_test_fails_naming_itself_and_its_phase_and_a_stuck_one_ends_the_session"
R = "tests/test_rendezvous.py"
RDZV = f"{R}::test_a_torchrun_rank_left_alone_names_the_attempt_the_missing_rank_and_the_timeout_to_raise"

MUTANTS = [
    {
        "file": "tests/processes.py",
        "find": "            if dead:\n",
        "replace": "            if dead and time.monotonic() > deadline:\n",
        "tests": [DIES],
        "why": "a dead rank is noticed only at the call's timeout (the hang of issue 29)",
    },
    {
        "file": "tests/processes.py",
        "find": "        self.kill()\n        self.broken = message\n",
        "replace": "        self.kill()\n",
        "tests": [DIES],
        "why": "a killed pool is not remembered: the next call (the next hypothesis example) waits its timeout again",
    },
    {
        "file": "tests/processes.py",
        "find": 'died {phase}; the pool was killed")',
        "replace": 'died; the pool was killed")',
        "tests": [JOIN],
        "why": "the error does not say in which phase the rank died",
    },
    {
        "file": "tests/processes.py",
        "find": '"in the rendezvous (before running {who})"',
        "replace": '"while running {who}"',
        "tests": [JOIN],
        "why": "a rank lost in the rendezvous is reported as lost in the call",
    },
    {
        "file": "tests/processes.py",
        "find": 'stuck += [f"rank {r}"] if p.exitcode is None else []',
        "replace": "stuck += []",
        "tests": [LEAVE],
        "why": "a rank that will not leave is killed silently at the teardown",
    },
    {
        "file": "tests/processes.py",
        "find": "        if self.broken is None:\n            for q in self.jobs:\n                q.put(None)\n",
        "replace": "        if True:\n            for q in self.jobs:\n                q.put(None)\n",
        "tests": [JOIN],
        "why": "closing a killed pool writes to its closed queues",
    },
    {
        "file": "tests/processes.py",
        "find": 'ranks = ", ".join(f"rank {r}" for r in waiting)',
        "replace": 'ranks = "some rank"',
        "tests": [HANG],
        "why": "a timeout does not name the rank it waited for",
    },
    {
        "file": "tests/time_limit.py",
        "find": '    with _limited(item, "setup"):',
        "replace": '    with _limited(item, "call"):',
        "tests": [LIMIT],
        "why": "a hang in a fixture is reported as one in the test's call",
    },
    {
        "file": "tests/time_limit.py",
        "find": '        _stderr.write(f"\\n{message}\\n")  # in the log at once, whatever ends the session later\n',
        "replace": "",
        "tests": [LIMIT],
        "why": "a timed-out test is named only in the final summary, which a stuck session never prints",
    },
    {
        "file": "tests/time_limit.py",
        "find": "        watchdog.cancel()",
        "replace": "        pass",
        "tests": [LIMIT],
        "why": "a phase's watchdog outlives it and ends the session during a later test",
    },
    {
        "file": "tests/time_limit.py",
        "find": "    os._exit(STATUS)",
        "replace": "    os._exit(0)",
        "tests": [LIMIT],
        "why": "a session ended by the watchdog reports success",
    },
    {
        "file": "tests/time_limit.py",
        "find": "    signal.setitimer(signal.ITIMER_REAL, limit)",
        "replace": "    signal.setitimer(signal.ITIMER_REAL, limit + grace + 1)",
        "tests": [LIMIT],
        "why": "SIGALRM comes after the watchdog: every hang ends the whole session",
    },
    {
        "file": "src/composetrain/launch/rendezvous.py",
        "find": '            f"({timeout:g}s now; torchrun restarts the job if --max-restarts allows)"',
        "replace": '            "(torchrun restarts the job if --max-restarts allows)"',
        "tests": [RDZV],
        "why": "the attempt's timeout error does not say which timeout to raise",
    },
]
