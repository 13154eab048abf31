"""The planted bugs of src/composetrain/transforms/_ema_rule.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/_ema_rule.py",
        "find": '    if device.type == "meta":',
        "replace": '    if value == "meta":',
        "tests": [
            "tests/test_ema_timm.py::test_a_meta_device_is_refused_when_built",
        ],
        "why": "adv37: the meta device refused as a string only: torch.device('meta') averages nothing",
        "from": "adv37",
    },
    {
        "file": "src/composetrain/transforms/_ema_rule.py",
        "find": "    if value not in DTYPES:",
        "replace": "    if value.itemsize > 8:",
        "tests": [
            "tests/test_ema_timm.py::test_a_dtype_the_average_cannot_be_kept_in_is_refused_when_built",
        ],
        "why": "adv37: float8 accepted: its second update raises after optimizer.step()",
        "from": "adv37",
    },
    {
        "file": "src/composetrain/transforms/_ema_rule.py",
        "find": "DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)",
        "replace": "DTYPES = (torch.float32, torch.bfloat16, torch.float16)",
        "tests": [
            "tests/test_ema_timm.py::test_a_float64_average_of_a_float32_model_is_model_ema_v3s",
        ],
        "why": "adv37: a float64 average (timm's dtype=torch.float64) refused with the others",
        "from": "adv37",
    },
    {
        "file": "src/composetrain/transforms/_ema_rule.py",
        "find": "        decay = 1 - (1 + n / self.warmup_gamma) ** -self.warmup_power",
        "replace": "        decay = 1 - (n / self.warmup_gamma) ** -self.warmup_power",
        "tests": [
            "tests/test_ema_timm.py::test_the_decay_warmup_ramps_as_timms_get_decay",
        ],
        "why": "37.3: the decay warmup without timm's 1 +: decay 0 at the first average",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/transforms/_ema_rule.py",
        "find": "got {show(given)}; e.g. ema(0.999)",
        "replace": "got {decay}; e.g. ema(0.999)",
        "tests": [
            "tests/test_conventions.py::test_the_edges_of_each_arguments_rule[ema-decay]",
            "tests/test_conventions.py::test_numeric_and_flag_arguments_follow_one_rule[ema-decay]",
        ],
        "why": "an out-of-range decay shown without its type (np.float64(1.5) reads 1.5)",
        "from": "conventions_data",
    },
    {
        "file": "src/composetrain/transforms/_ema_rule.py",
        "find": "    return choices[choices.index(value)]",
        "replace": "    return value",
        "tests": [
            "tests/test_ema.py::test_string_likes_are_kept_as_plain_strings_so_checkpoints_load_without_code",
        ],
        "why": "adversarial: a NumPy string formula kept as given: the step prints formula=np.str_('sum')",
        "from": "issue24_ema",
    },
]
