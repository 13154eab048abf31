"""The planted bugs of src/composetrain/transforms/activation_checkpointing.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/activation_checkpointing.py",
        "find": "return checkpoint(run, *args, *kwargs.values(), use_reentrant=False,",
        "replace": "return checkpoint(forward, *args, **kwargs, use_reentrant=False,",
        "tests": [
            "tests/test_checkpointed_keywords.py::test_every_keyword_reaches_the_module_unchanged",
        ],
        "why": "keywords passed to checkpoint, which takes early_stop=, debug=... as its own options",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/transforms/activation_checkpointing.py",
        "find": "def _run_checkpointed(forward: Callable[..., Any], module: nn.Module, /, *args",
        "replace": "def _run_checkpointed(forward: Callable[..., Any], module: nn.Module, *args",
        "tests": [
            "tests/test_checkpointed_keyword_collisions.py",
        ],
        "why": "a module keyword named forward= or module= taken by the wrapper",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/transforms/activation_checkpointing.py",
        "find": "@torch.compiler.disable\n",
        "replace": "",
        "tests": [
            "tests/test_compile.py::test_compiled_composition_equals_eager",
        ],
        "why": "23.14: TorchDynamo traces checkpoint's context_fn and fails (torch 2.14)",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/transforms/activation_checkpointing.py",
        "find": "        refuse_checkpointed_twice(chosen.modules, self)  # every call",
        "replace": "            refuse_checkpointed_twice(chosen.modules, self)  # every call",
        "tests": [
            "tests/test_hf.py::test_checkpointing_switched_on_in_transformers_after_the_first_update_is_refused_at_the_next",
        ],
        "why": "25.9: transformers' own checkpointing checked only when the submodules are chosen (first update)",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/transforms/activation_checkpointing.py",
        "find": "refuse_cache(module, (*args, *kwargs.values()))",
        "replace": "refuse_cache(module, tuple(kwargs.values()))",
        "tests": [
            "tests/test_hf.py::test_a_key_value_cache_under_checkpointed_blocks_is_refused_before_backward",
        ],
        "why": "25.10: only keyword arguments searched for a cache; GPT-2 passes its cache positionally",
        "from": "issue25_hf",
    },
]
