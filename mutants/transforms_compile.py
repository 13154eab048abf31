"""The planted bugs of src/composetrain/transforms/compile.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": "            check_inside(label, refused_inside(FULLGRAPH), inner.roles)",
        "replace": "            check_inside(label, refused_inside(self.role), inner.roles)",
        "tests": [
            "tests/test_composition_rules.py::test_every_pair_is_refused_with_the_tables_reason_or_agrees_with_the_plain_step",
        ],
        "why": (
            "31.4.12: a fullgraph compile checked with compile's (empty) row: it wraps distributed, and fails at "
            "the first update"
        ),
        "from": "composition_rules",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": '        if options["fullgraph"]:  # before the check of the role',
        "replace": '        if options["cache"]:  # before the check of the role',
        "tests": [
            "tests/test_composition_rules.py::test_every_pair_is_refused_with_the_tables_reason_or_agrees_with_the_plain_step",
        ],
        "why": "31.4.13: every compile (cache=True by default) refuses the graph breakers inside it",
        "from": "composition_rules",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": (
            "return self._inner().prepare(state, batch, ctx._replace(call_step=lambda plain: compiled.get(plain, "
            "options)))"
        ),
        "replace": "return self._inner().prepare(state, batch, ctx)",
        "tests": [
            "tests/test_compile.py::test_compiled_composition_equals_eager",
        ],
        "why": "23.1: compile sets nothing in the context: every composition runs eagerly, silently",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": "settings = {k: options[k] for k in _COMPILE_OPTIONS}",
        "replace": 'settings = {k: options[k] for k in _COMPILE_OPTIONS if k != "dynamic"}',
        "tests": [
            "tests/test_compile.py::test_dynamic_reaches_torch",
        ],
        "why": "23.3: dynamic= is checked and shown but never given to torch.compile",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": 'return tuple(self.options[k] for k in ("mode", "dynamic", "fullgraph", "backend", "cache"))',
        "replace": 'return tuple(self.options[k] for k in ("mode", "dynamic", "fullgraph", "backend"))',
        "tests": [
            "tests/test_compile.py::test_bare_and_called_forms_print_compare_and_stay_independent",
        ],
        "why": "23.4: cache=False left out of the configuration: two different steps compare equal",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": 'if mode is not None and backend != "inductor":',
        "replace": 'if mode is not None and backend == "eager":',
        "tests": [
            "tests/test_compile.py::test_arguments_are_checked_when_built",
        ],
        "why": "23.5: an inductor mode with the aot_eager backend passes the build, torch ignores or fails later",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": "    if mode in _CUDAGRAPHS:",
        "replace": "    if mode in _CUDAGRAPHS[1:]:",
        "tests": [
            "tests/test_compile.py::test_arguments_are_checked_when_built",
        ],
        "why": "23.6: reduce-overhead (CUDA graphs) gets the generic message, without the reason and the fix",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": 'self.compile_cache = options["cache"]',
        "replace": "self.compile_cache = True",
        "tests": [
            "tests/test_compile.py::test_the_capability_says_the_driver_keeps_the_cache",
            "tests/test_compile_run.py::test_without_cache_torchs_own_cache_folder_is_used",
        ],
        "why": "23.7: cache=False still compiles into (and loads from) checkpoint_dir",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": (
            "return self._inner().prepare(state, batch, ctx._replace(call_step=lambda plain: compiled.get(plain, "
            "options)))"
        ),
        "replace": (
            "return self._inner().prepare(state, batch, ctx)._replace(call_step=lambda plain: "
            "compiled.get(plain, options))"
        ),
        "tests": [
            "tests/test_compile.py::test_under_distributed_buckets_below_ddps_first_are_refused_with_the_fix",
        ],
        "why": "23.15: call_step set after the inner prepare: distributed inside compile cannot see it to refuse",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": 'if isinstance(backend, str) and backend == "cudagraphs":',
        "replace": 'if isinstance(backend, str) and backend == "cuda_graphs":',
        "tests": [
            "tests/test_compile.py::test_arguments_are_checked_when_built",
        ],
        "why": "23.20: backend='cudagraphs' passes, and its replays overwrite the losses the composition keeps",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": "check_inside(label, refused_inside(FULLGRAPH), inner.roles)",
        "replace": "check_inside(label, refused_inside(FULLGRAPH), {inner.role})",
        "tests": [
            "tests/test_compile.py::test_fullgraph_with_a_transform_that_breaks_the_graph_is_refused_when_built",
        ],
        "why": "23.21: only a checkpoint_activations right inside is refused, not one deeper in the composition",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": ('        if options["fullgraph"]:\n            self.roles'),
        "replace": ('        if options["cache"]:\n            self.roles'),
        "tests": [
            "tests/test_compile.py::test_fullgraph_with_a_transform_that_breaks_the_graph_is_refused_when_built",
        ],
        "why": "23.22: every compile claims fullgraph: checkpoint_activations outside a default compile is refused",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": "            self.roles = self.roles | {FULLGRAPH}",
        "replace": "            self.roles = self.roles | {self.role}",
        "tests": [
            "tests/test_compile.py::test_fullgraph_with_a_transform_that_breaks_the_graph_is_refused_when_built",
        ],
        "why": "23.23: fullgraph not said in the roles: checkpoint_activations outside it fails at the first update",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": ("    def __getstate__(self) -> dict[str, Any]:\n        return {}"),
        "replace": ("    def __getstate__(self) -> dict[str, Any]:\n        return dict(vars(self))"),
        "tests": [
            "tests/test_compile.py::test_a_compiled_state_pickles_and_its_copies_compile_their_own_wrappers",
        ],
        "why": "23.25: the wrappers travel with the state: torch.save(state) fails, a copy shares the original's",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": "        self.steps, self.plain = {}, []\n",
        "replace": "        self.steps = {}\n",
        "tests": [
            "tests/test_compile.py::test_a_compiled_state_pickles_and_its_copies_compile_their_own_wrappers",
        ],
        "why": "23.26: a copied state's compile store lacks its list of steps: the first compiled update fails",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": 'key = (id(step), *(id(options[k]) if k == "backend" else options[k] for k in _COMPILE_OPTIONS))',
        "replace": 'key = (0, *(id(options[k]) if k == "backend" else options[k] for k in _COMPILE_OPTIONS))',
        "tests": [
            "tests/test_compile.py::test_compiled_compositions_of_different_plain_steps_on_one_state_each_run_their_own",
        ],
        "why": "30.3: compiled wrappers keyed by options alone: a second plain step runs the first's loss",
        "from": "issue29_check",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": 'key = (id(step), *(id(options[k]) if k == "backend" else options[k] for k in _COMPILE_OPTIONS))',
        "replace": (
            'key = (id(getattr(step, "__code__", step)), *(id(options[k]) if k == "backend" else options[k] for '
            "k in _COMPILE_OPTIONS))"
        ),
        "tests": [
            "tests/test_compile.py::test_compiled_compositions_of_different_plain_steps_on_one_state_each_run_their_own",
        ],
        "why": "30.3: keyed by code object: closures of one factory (another loss weight) share a wrapper",
        "from": "issue29_check",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": "        found = self.steps.get(key)",
        "replace": "        found = next(iter(self.steps.values()), None)",
        "tests": [
            "tests/test_compile.py::test_compiled_compositions_of_different_plain_steps_on_one_state_each_run_their_own",
        ],
        "why": "30.3: the first compiled wrapper reused for every plain step on the state",
        "from": "issue29_check",
    },
]
