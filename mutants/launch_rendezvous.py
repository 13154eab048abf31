"""The planted bugs of src/composetrain/launch/rendezvous.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/launch/rendezvous.py",
        "find": '    timeout = check_real(timeout, "rendezvous", "timeout", example=',
        "replace": '    timeout = check_real(timeout, "rendezvous", "timeout", finite=False, example=',
        "tests": [
            "tests/test_conventions.py::test_the_edges_of_each_arguments_rule[rendezvous-timeout]",
            "tests/test_conventions.py::test_numeric_and_flag_arguments_follow_one_rule[rendezvous-timeout]",
        ],
        "why": "timeout=inf accepted: an OverflowError from timedelta when a multi-process group is set up",
        "from": "conventions_data",
    },
    {
        "file": "src/composetrain/launch/rendezvous.py",
        "find": '    timeout = check_real(timeout, "rendezvous", "timeout", example="timeout=300 (seconds)")',
        "replace": "    timeout = float(timeout)",
        "tests": [
            "tests/test_conventions.py::test_the_edges_of_each_arguments_rule[rendezvous-timeout]",
            "tests/test_conventions.py::test_numeric_and_flag_arguments_follow_one_rule[rendezvous-timeout]",
            "tests/test_rendezvous.py::test_bad_arguments",
        ],
        "why": "the timeout taken by float(): True is one second, 0 and NaN accepted, '300' a string turned number",
        "from": "conventions_data",
    },
    {
        "file": "src/composetrain/launch/rendezvous.py",
        "find": 'local = int(text) if re.fullmatch(r"\\s*[0-9]+\\s*", text) else 0',
        "replace": "local = int(text) if text.strip().isdigit() else 0",
        "tests": [
            "tests/test_launch_env.py::test_a_local_world_size_that_is_no_count_is_refused_naming_it",
        ],
        "why": "LOCAL_WORLD_SIZE='²' passes isdigit and ends in a bare int() error",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/launch/rendezvous.py",
        "find": 'if "SLURM_STEP_NODELIST" in env:',
        "replace": 'if "SLURM_STEP_NODELIST" in env and "SLURM_JOB_NODELIST" not in env:',
        "tests": [
            "tests/test_launch_env.py::test_a_step_on_part_of_the_allocation_meets_on_its_own_first_node",
        ],
        "why": "a step on part of the job meets on the job's first node",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/launch/rendezvous.py",
        "find": "if world > 1 and not addr.strip():",
        "replace": "if world > 1 and not addr:",
        "tests": [
            "tests/test_launch_env.py::test_an_empty_master_addr_is_refused_before_waiting_for_the_others",
        ],
        "why": "a MASTER_ADDR of spaces makes the other ranks wait out the timeout",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/launch/rendezvous.py",
        "find": '            f"({timeout:g}s now; torchrun restarts the job if --max-restarts allows)"',
        "replace": '            "(torchrun restarts the job if --max-restarts allows)"',
        "tests": [
            "tests/test_rendezvous.py::test_a_torchrun_rank_left_alone_names_the_attempt_the_missing_rank_and_the_timeout_to_raise",
        ],
        "why": "the attempt's timeout error does not say which timeout to raise",
        "from": "issue29_launch",
    },
]
