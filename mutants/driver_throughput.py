"""The planted bugs of src/composetrain/driver/throughput.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": "p.device, p.requires_grad) for name, p in model.named_parameters())",
        "replace": "p.device) for name, p in model.named_parameters())",
        "tests": [
            "tests/test_flops.py::test_a_later_call_after_freezing_or_a_submodules_mode_change_is_counted_again",
        ],
        "why": "the kept count taken after parameters were frozen: weight gradients counted that are not computed",
        "from": "adv36",
    },
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": "    modes = tuple(m.training for m in model.modules())\n",
        "replace": "    modes = model.training\n",
        "tests": [
            "tests/test_flops.py::test_a_later_call_after_freezing_or_a_submodules_mode_change_is_counted_again",
        ],
        "why": "only the root's mode in the layout: a submodule put in eval mode keeps the training forward's count",
        "from": "adv36",
    },
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": (
            "        return float(self.total) if samples == self.samples else self.total * samples / self.samples\n"
        ),
        "replace": "        return float(self.total)\n",
        "tests": [
            "tests/test_flops.py::test_an_update_of_another_size_is_scaled_by_its_samples",
        ],
        "why": "every update logged with the counted one's FLOPs, whatever its samples",
        "from": "adv36",
    },
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": "        self.done = True\n",
        "replace": "",
        "tests": [
            "tests/test_flops.py::test_the_flops_are_counted_on_the_first_update_only",
        ],
        "why": "the FLOPs counted on every update (FlopCounterMode slows each down)",
        "from": "observability",
    },
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": "return float(self.total) if samples == self.samples else self.total * samples / self.samples",
        "replace": "return float(self.total)",
        "tests": [
            "tests/test_flops.py::test_an_update_of_another_size_is_scaled_by_its_samples",
        ],
        "why": "a short update's FLOPs taken as a full one's",
        "from": "observability",
    },
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": '            f.write("5")  # resets VmHWM to the current resident size\n',
        "replace": "            pass\n",
        "tests": [
            "tests/test_flops.py::test_each_record_holds_its_own_peak_memory",
        ],
        "why": "the peak memory never reset: every later record repeats the run's peak",
        "from": "observability",
    },
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": "if kept is not None and kept[0]() is step and kept[1] == layout:",
        "replace": "if kept is not None and kept[0]() is step:",
        "tests": [
            "tests/test_flops.py::test_a_later_call_on_the_same_model_composition_and_batch_layout_takes_the_count_made",
        ],
        "why": (
            "the count kept for any batch: batches of another shape log the first shape's FLOPs scaled, not counted"
        ),
        "from": "observability_speed",
    },
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": "if kept is not None and kept[0]() is step and kept[1] == layout:",
        "replace": "if kept is not None and kept[1] == layout:",
        "tests": [
            "tests/test_flops.py::test_a_later_call_on_the_same_model_composition_and_batch_layout_takes_the_count_made",
        ],
        "why": "the count kept for another composition (checkpointed activations recompute: more FLOPs)",
        "from": "observability_speed",
    },
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": (
            "params = tuple((name, tuple(p.shape), p.dtype, p.device, p.requires_grad) for name, p in "
            "model.named_parameters())"
        ),
        "replace": "params = ()",
        "tests": [
            "tests/test_flops.py::test_a_later_call_on_the_same_model_composition_and_batch_layout_takes_the_count_made",
            "tests/test_flops.py::test_a_head_swapped_for_a_wider_one_is_counted_again",
        ],
        "why": "a model grown or shrunk in place (a layer added, a head swapped) keeps the old count",
        "from": "observability_speed",
    },
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": "return (type(model), modes, params, _leaf_layout(batch))",
        "replace": "return (type(model), params, _leaf_layout(batch))",
        "tests": [
            "tests/test_flops.py::test_a_later_call_on_the_same_model_composition_and_batch_layout_takes_the_count_made",
        ],
        "why": "a model in another mode (eval: other branches run) keeps the training mode's count",
        "from": "observability_speed",
    },
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": ("    def __eq__(self, other: object) -> bool:\n        return False\n"),
        "replace": ("    def __eq__(self, other: object) -> bool:\n        return True\n"),
        "tests": [
            "tests/test_flops.py::test_a_batch_holding_an_object_of_the_users_is_counted_every_time",
        ],
        "why": "a batch of the user's objects taken as laid out alike: what they hold may differ call to call",
        "from": "observability_speed",
    },
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": "_COUNTED[model] = (weakref.ref(step), layout, self.total)",
        "replace": "_COUNTED[model] = ((lambda kept=step: kept), layout, self.total)",
        "tests": [
            "tests/test_flops.py::test_a_count_kept_holds_neither_the_model_nor_the_composition",
        ],
        "why": "the composition held by the kept count: a step closing over its model keeps both alive for good",
        "from": "observability_speed",
    },
]
