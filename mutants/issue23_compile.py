"""Planted bugs for issue 23 (ct.compile), each caught by the tests named for it (see tools/mutants.py)."""

T = "tests/test_compile.py"
R = "tests/test_compile_run.py"
CALL_STEP = "ctx._replace(call_step=lambda plain: compiled.get(plain, options))"
LATE = "ctx)._replace(call_step=lambda plain: compiled.get(plain, options))"

MUTANTS = [
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": f"return self._inner().prepare(state, batch, {CALL_STEP})",
        "replace": "return self._inner().prepare(state, batch, ctx)",
        "tests": [f"{T}::test_compiled_composition_equals_eager"],
        "why": "23.1: compile sets nothing in the context: every composition runs eagerly, silently",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": "call = self.step if ctx.call_step is None else ctx.call_step(self.step)",
        "replace": "call = self.step",
        "tests": [f"{T}::test_compiled_composition_equals_eager"],
        "why": "23.2: the innermost pass ignores the channel: the plain step is never compiled",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": "settings = {k: options[k] for k in _COMPILE_OPTIONS}",
        "replace": 'settings = {k: options[k] for k in _COMPILE_OPTIONS if k != "dynamic"}',
        "tests": [f"{T}::test_dynamic_reaches_torch"],
        "why": "23.3: dynamic= is checked and shown but never given to torch.compile",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": 'return tuple(self.options[k] for k in ("mode", "dynamic", "fullgraph", "backend", "cache"))',
        "replace": 'return tuple(self.options[k] for k in ("mode", "dynamic", "fullgraph", "backend"))',
        "tests": [f"{T}::test_bare_and_called_forms_print_compare_and_stay_independent"],
        "why": "23.4: cache=False left out of the configuration: two different steps compare equal",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": 'if mode is not None and backend != "inductor":',
        "replace": 'if mode is not None and backend == "eager":',
        "tests": [f"{T}::test_arguments_are_checked_when_built"],
        "why": "23.5: an inductor mode with the aot_eager backend passes the build, torch ignores or fails later",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": "    if mode in _CUDAGRAPHS:",
        "replace": "    if mode in _CUDAGRAPHS[1:]:",
        "tests": [f"{T}::test_arguments_are_checked_when_built"],
        "why": "23.6: reduce-overhead (CUDA graphs) gets the generic message, without the reason and the fix",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": 'self.compile_cache = options["cache"]',
        "replace": "self.compile_cache = True",
        "tests": [
            f"{T}::test_the_capability_says_the_driver_keeps_the_cache",
            f"{R}::test_without_cache_torchs_own_cache_folder_is_used",
        ],
        "why": "23.7: cache=False still compiles into (and loads from) checkpoint_dir",
    },
    {
        "file": "src/composetrain/transforms/distributed.py",
        "find": 'self.options["bucket_cap_mb"] < _FIRST_BUCKET_MB',
        "replace": 'self.options["bucket_cap_mb"] < _FIRST_BUCKET_MB / 1e9',
        "tests": [f"{T}::test_under_distributed_buckets_below_ddps_first_are_refused_with_the_fix"],
        "why": "23.8: small DDP buckets under compile reach torch's bare AssertionError in DDPOptimizer",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "            self.compile_cache.enter()",
        "replace": "            pass",
        "tests": [f"{R}::test_a_restarted_run_compiles_from_the_caches_kept_beside_its_checkpoints"],
        "why": "23.9: torch's caches stay in the machine's /tmp: a requeued job on another node compiles cold",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "            now[0] - self.window_compiled[0],\n",
        "replace": "            now[0] - self.compiled_before[0],\n",
        "tests": [f"{R}::test_records_count_compilations_and_their_time_and_the_bottleneck_names_them"],
        "why": "23.10: the records count compilations since the run began, not in their window",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "if count and seconds > 0.2 * self.computed:",
        "replace": "if count and seconds > 2 * self.computed:",
        "tests": [f"{R}::test_records_count_compilations_and_their_time_and_the_bottleneck_names_them"],
        "why": "23.11: the bottleneck never names compile time (it cannot exceed the step's time)",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "if run_compiles > 0:",
        "replace": "if run_compiles >= 0:",
        "tests": [f"{R}::test_records_count_compilations_and_their_time_and_the_bottleneck_names_them"],
        "why": "23.12: eager runs' records gain compile fields",
    },
    {
        "file": "src/composetrain/core/state.py",
        "find": 'and type(model).__name__ == "OptimizedModule":',
        "replace": 'and type(model).__name__ == "OptimisedModule":',
        "tests": [f"{T}::test_a_model_wrapped_by_torch_compile_is_refused_with_the_fix"],
        "why": "23.13: torch.compile(model) accepted: its checkpoints carry '_orig_mod.' keys an eager model refuses",
    },
    {
        "file": "src/composetrain/transforms/activation_checkpointing.py",
        "find": "@torch.compiler.disable\n",
        "replace": "",
        "tests": [f"{T}::test_compiled_composition_equals_eager"],
        "why": "23.14: TorchDynamo traces checkpoint's context_fn and fails (torch 2.14)",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": f"return self._inner().prepare(state, batch, {CALL_STEP})",
        "replace": f"return self._inner().prepare(state, batch, {LATE}",
        "tests": [f"{T}::test_under_distributed_buckets_below_ddps_first_are_refused_with_the_fix"],
        "why": "23.15: call_step set after the inner prepare: distributed inside compile cannot see it to refuse",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "            self.compile_cache.leave()  # torch's caches where they were before the run",
        "replace": "            pass",
        "tests": [
            f"{R}::test_a_restarted_run_compiles_from_the_caches_kept_beside_its_checkpoints",
            f"{R}::test_a_run_that_fails_gives_the_cache_folder_back_at_once",
        ],
        "why": "23.16: after ct.run, the process keeps compiling into the run's checkpoint_dir",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": 'record["compile_s"] = compile_s',
        "replace": 'record["compile_s"] = compiled[1]',
        "tests": [f"{T}::test_under_ct_run_every_rank_logs_the_same_compile_record"],
        "why": "23.17: each rank logs its own compile seconds: the ranks' records differ",
    },
    # a-compile (adversary): the backward compile time, fullgraph with checkpoint_activations, the cudagraphs backend
    {
        "file": "src/composetrain/driver/compiling.py",
        "find": "return len(frames), float(sum(frames) + sum(record.get(_BACKWARD, [])))",
        "replace": "return len(frames), float(sum(frames))",
        "tests": [f"{R}::test_compile_seconds_include_the_backward_compiled_at_the_first_backward"],
        "why": "23.18: compile_s leaves out the backward graphs compiled lazily at the first backward",
    },
    {
        "file": "src/composetrain/driver/compiling.py",
        "find": '_BACKWARD = "backward._backward_impl"',
        "replace": '_BACKWARD = "backward._backward"',
        "tests": [f"{R}::test_compile_seconds_include_the_backward_compiled_at_the_first_backward"],
        "why": "23.19: the backward compile read under a name torch does not record: silently nothing",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": 'if isinstance(backend, str) and backend == "cudagraphs":',
        "replace": 'if isinstance(backend, str) and backend == "cuda_graphs":',
        "tests": [f"{T}::test_arguments_are_checked_when_built"],
        "why": "23.20: backend='cudagraphs' passes, and its replays overwrite the losses the composition keeps",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": 'if options["fullgraph"] and "checkpoint_activations" in inner.roles:',
        "replace": 'if options["fullgraph"] and inner.role == "checkpoint_activations":',
        "tests": [f"{T}::test_fullgraph_with_checkpointed_submodules_is_refused_when_built"],
        "why": "23.21: only a checkpoint_activations right inside is refused, not one deeper in the composition",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": '        if options["fullgraph"]:\n            self.roles',
        "replace": '        if options["cache"]:\n            self.roles',
        "tests": [f"{T}::test_fullgraph_with_checkpointed_submodules_is_refused_when_built"],
        "why": "23.22: every compile claims fullgraph: checkpoint_activations outside a default compile is refused",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": "            self.roles = self.roles | {FULLGRAPH}",
        "replace": "            self.roles = self.roles | {self.role}",
        "tests": [f"{T}::test_fullgraph_with_checkpointed_submodules_is_refused_when_built"],
        "why": "23.23: fullgraph not said in the roles: checkpoint_activations outside it fails at the first update",
    },
    {
        "file": "src/composetrain/transforms/activation_checkpointing.py",
        "find": '"compile(fullgraph=True)": "the chosen submodules',
        "replace": '"compile(fullgraph=true)": "the chosen submodules',
        "tests": [f"{T}::test_fullgraph_with_checkpointed_submodules_is_refused_when_built"],
        "why": "23.24: checkpoint_activations names a role nobody has: outside fullgraph it is not refused",
    },
]
