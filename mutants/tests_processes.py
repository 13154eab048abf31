"""The planted bugs of tests/processes.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "tests/processes.py",
        "find": "            if dead:\n",
        "replace": "            if dead and time.monotonic() > deadline:\n",
        "tests": [
            "tests/test_processes.py::test_a_pool_whose_rank_dies_mid_call_fails_at_once_and_for_every_later_call",
        ],
        "why": "a dead rank is noticed only at the call's timeout (the hang of issue 29)",
        "from": "issue29_launch",
    },
    {
        "file": "tests/processes.py",
        "find": ("        self.kill()\n        self.broken = message\n"),
        "replace": "        self.kill()\n",
        "tests": [
            "tests/test_processes.py::test_a_pool_whose_rank_dies_mid_call_fails_at_once_and_for_every_later_call",
        ],
        "why": "a killed pool is not remembered: the next call (the next hypothesis example) waits its timeout again",
        "from": "issue29_launch",
    },
    {
        "file": "tests/processes.py",
        "find": 'died {phase}; the pool was killed")',
        "replace": 'died; the pool was killed")',
        "tests": [
            "tests/test_processes.py::test_a_pool_whose_rank_dies_before_joining_names_the_rendezvous",
        ],
        "why": "the error does not say in which phase the rank died",
        "from": "issue29_launch",
    },
    {
        "file": "tests/processes.py",
        "find": '"in the rendezvous (before running {who})"',
        "replace": '"while running {who}"',
        "tests": [
            "tests/test_processes.py::test_a_pool_whose_rank_dies_before_joining_names_the_rendezvous",
        ],
        "why": "a rank lost in the rendezvous is reported as lost in the call",
        "from": "issue29_launch",
    },
    {
        "file": "tests/processes.py",
        "find": 'stuck += [f"rank {r}"] if p.exitcode is None else []',
        "replace": "stuck += []",
        "tests": [
            "tests/test_processes.py::test_a_pool_whose_rank_will_not_leave_fails_its_teardown_and_is_killed",
        ],
        "why": "a rank that will not leave is killed silently at the teardown",
        "from": "issue29_launch",
    },
    {
        "file": "tests/processes.py",
        "find": ("        if self.broken is None:\n            for q in self.jobs:\n                q.put(None)\n"),
        "replace": ("        if True:\n            for q in self.jobs:\n                q.put(None)\n"),
        "tests": [
            "tests/test_processes.py::test_a_pool_whose_rank_dies_before_joining_names_the_rendezvous",
        ],
        "why": "closing a killed pool writes to its closed queues",
        "from": "issue29_launch",
    },
    {
        "file": "tests/processes.py",
        "find": 'ranks = ", ".join(f"rank {r}" for r in waiting)',
        "replace": 'ranks = "some rank"',
        "tests": [
            "tests/test_processes.py::test_a_pool_whose_rank_hangs_is_killed_on_timeout",
        ],
        "why": "a timeout does not name the rank it waited for",
        "from": "issue29_launch",
    },
]
