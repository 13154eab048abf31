"""Planted bugs for issue 25 (Hugging Face models), each caught by the tests named for it (see tools/mutants.py)."""

HF = "tests/test_hf.py::"
TOKENS = "tests/test_shifted_tokens.py::"

MUTANTS = [
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "return (labels[..., 1:] != self.ignore_index).sum()",
        "replace": "return (labels != self.ignore_index).sum()",
        "tests": [TOKENS + "test_accumulate_with_shifted_tokens_is_the_textbook_large_batch_update"],
        "why": "25.1: the first label of each sequence counted, which the shifted loss never predicts",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "return (labels[..., 1:] != self.ignore_index).sum()",
        "replace": "return (labels[..., :-1] != self.ignore_index).sum()",
        "tests": [TOKENS + "test_accumulate_with_shifted_tokens_is_the_textbook_large_batch_update"],
        "why": "25.2: the shift taken at the wrong end: the last label dropped instead of the first",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "return (labels[..., 1:] != self.ignore_index).sum()",
        "replace": "return (labels[..., 1:] != -100).sum()",
        "tests": [TOKENS + "test_tuple_batches_take_an_index_and_other_ignore_indices"],
        "why": "25.3: ignore_index accepted and then ignored: -100 hard-coded",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "if labels.dim() < 2:",
        "replace": "if labels.dim() < 1:",
        "tests": [TOKENS + "test_a_batch_without_usable_labels_is_refused_naming_the_fix"],
        "why": "25.4: 1-D labels accepted: the shift then runs across the batch, not along a sequence",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "if isinstance(labels_key, bool) or not isinstance(labels_key, (str, numbers.Integral)):",
        "replace": "if not isinstance(labels_key, (str, numbers.Integral)):",
        "tests": [TOKENS + "test_bad_arguments_are_refused_when_built"],
        "why": "25.5: True taken as index 1 (bool is an int subclass)",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "if -len(batch) <= self.key < len(batch):",
        "replace": "if -len(batch) <= self.key <= len(batch):",
        "tests": [TOKENS + "test_a_batch_without_usable_labels_is_refused_naming_the_fix"],
        "why": "25.6: off by one: an index one past the tuple raises a bare IndexError, not the fix",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "if not isinstance(labels, torch.Tensor) or labels.is_floating_point() or labels.is_complex():",
        "replace": "if not isinstance(labels, torch.Tensor):",
        "tests": [TOKENS + "test_a_batch_without_usable_labels_is_refused_naming_the_fix"],
        "why": "25.7: float labels (logits or probabilities given by mistake) counted as tokens",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": 'if isinstance(loss, Mapping) and isinstance(loss.get("loss"), torch.Tensor):',
        "replace": 'if isinstance(out, Mapping) and isinstance(out.get("loss"), torch.Tensor):',
        "tests": [HF + "test_a_step_returning_the_model_output_is_told_to_return_its_loss"],
        "why": "25.8: (ModelOutput, metrics) gets the generic message, not the one naming .loss",
    },
    {
        "file": "src/composetrain/transforms/activation_checkpointing.py",
        "find": "        refuse_checkpointed_twice(chosen.modules, self)  # every call",
        "replace": "            refuse_checkpointed_twice(chosen.modules, self)  # every call",
        "tests": [HF + "test_checkpointing_switched_on_in_transformers_after_the_first_update_is_refused_at_the_next"],
        "why": "25.9: transformers' own checkpointing checked only when the submodules are chosen (first update)",
    },
    {
        "file": "src/composetrain/transforms/activation_checkpointing.py",
        "find": "refuse_cache(module, (*args, *kwargs.values()))",
        "replace": "refuse_cache(module, tuple(kwargs.values()))",
        "tests": [HF + "test_a_key_value_cache_under_checkpointed_blocks_is_refused_before_backward"],
        "why": "25.10: only keyword arguments searched for a cache; GPT-2 passes its cache positionally",
    },
    {
        "file": "src/composetrain/transforms/_recompute.py",
        "find": 'if any(k.__name__ == "Cache" and k.__module__.startswith("transformers") for k in kinds):',
        "replace": 'if any(k.__name__ == "Cache" and k.__module__ == "transformers" for k in kinds):',
        "tests": [HF + "test_a_key_value_cache_under_checkpointed_blocks_is_refused_before_backward"],
        "why": "25.11: the Cache class looked for in transformers' top module, where it is only re-exported",
    },
    {
        "file": "src/composetrain/transforms/_recompute.py",
        "find": 'flagged = [m for m in module.modules() if getattr(m, "gradient_checkpointing", False) is True]',
        "replace": 'flagged = [m for m in module.children() if getattr(m, "gradient_checkpointing", False) is True]',
        "tests": [HF + "test_transformers_own_checkpointing_under_checkpoint_activations_is_refused"],
        "why": "25.12: the chosen block itself not looked at, only its children (GPT2Block's flag is its own)",
    },
    {
        "file": "examples/finetune_hf.py",
        "find": "ct.accumulate(args.accumulate, weight=ct.shifted_tokens()),",
        "replace": "ct.accumulate(args.accumulate, weight=lambda b: (b['labels'] != IGNORE).sum()),",
        "tests": ["tests/test_examples.py::test_the_hf_finetune_trains_in_bf16_and_resumes_bit_exactly"],
        "why": "25.13: the example falls back to the unshifted count",
    },
]
