"""Planted bugs in issue 19's trust fixes: metric names, the checkpoint folder, sharding's 0-dim parameters
and Adagrad, the recomputation's random streams and keywords, loss-scaling constants, accumulate('auto')'s
rollback, launch variables, the lr helpers and the plot (see tools/mutants.py)."""

T_NAMES = "tests/test_metric_names.py"
T_VALUES = "tests/test_metric_values_refused.py"
T_FOLDER = "tests/test_checkpoint_folder.py"
T_SHARD = "tests/test_sharded_setup.py"
T_RANDOM = "tests/test_recomputed_randomness.py"
T_UNDO = "tests/test_auto_accumulate_undo.py"
T_ODD = "tests/test_launch_env_odd.py"
T_LR = "tests/test_lr_odd_numbers.py"
T_PLOT = "tests/test_plot_odd_lines.py"

MUTANTS = [
    # -- metric names (core/metric_names.py, checked in the pass) -------------------------------------------
    {
        "file": "src/composetrain/core/metric_names.py",
        "find": "name = k if type(k) is str else str.__str__(k)",
        "replace": "name = k",
        "tests": [f"{T_NAMES}::test_str_subclass_names_are_logged_saved_and_resumed_as_plain_str"],
        "why": "a str subclass (StrEnum, np.str_) kept as the metric's name: the checkpoint cannot hold it",
    },
    {
        "file": "src/composetrain/core/metric_names.py",
        "find": '"skipped", "global_batch", "eval"}',
        "replace": '"skipped", "eval"}',
        "tests": [f"{T_NAMES}::test_the_reserved_names_are_every_field_the_driver_writes"],
        "why": "global_batch missing from the reserved names: a metric of that name overwrites the field",
    },
    {
        "file": "src/composetrain/core/metric_names.py",
        "find": "if name in plain:",
        "replace": "if name in plain and plain[name] is v:",
        "tests": [f"{T_VALUES}::test_two_training_metrics_that_name_the_same_text_are_refused_not_merged"],
        "why": "two metrics of the same text merged, one silently overwriting the other",
    },
    {
        "file": "src/composetrain/core/metric_names.py",
        "find": "            name.encode()\n",
        "replace": '            name.encode(errors="surrogateescape")\n',
        "tests": [f"{T_VALUES}::test_a_metric_name_that_utf8_cannot_encode_is_refused_at_the_first_update"],
        "why": "a name with a lone surrogate passes the check and crashes TensorBoard's writer later",
    },
    {
        "file": "src/composetrain/driver/evaluation.py",
        "find": "metric_names(metrics, EVAL_FIELDS, ",
        "replace": "metric_names(metrics, EVAL_FIELDS | {'loss', 'lr'}, ",
        "tests": [f"{T_NAMES}::test_an_eval_metric_named_loss_or_lr_is_kept_in_the_file"],
        "why": "evaluations refuse the training record's fields (loss, lr), which they never write",
    },
    # -- the checkpoint folder (driver/folder.py, driver/checkpoint.py) ------------------------------------
    {
        "file": "src/composetrain/checkpoint/folder.py",
        "find": 'return int(match[1]) if match and name == f"step-{int(match[1]):09d}" else None',
        "replace": "return int(match[1]) if match else None",
        "tests": [f"{T_FOLDER}::test_a_step_name_with_a_spare_leading_zero_is_the_users_and_never_pruned"],
        "why": "step-0000000005 (a spare zero, a copy named by hand) taken for a checkpoint",
    },
    {
        "file": "src/composetrain/checkpoint/folder.py",
        "find": "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        "replace": "fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)",
        "tests": [f"{T_FOLDER}::test_a_second_holder_of_the_folder_is_refused_until_the_first_closes"],
        "why": "a shared lock: two runs hold the folder together",
    },
    {
        "file": "src/composetrain/checkpoint/folder.py",
        "find": "    if stat.S_ISREG(mode):\n        return None",
        "replace": "    if not stat.S_ISDIR(mode):\n        return None",
        "tests": [f"{T_FOLDER}::test_a_fifo_in_place_of_a_file_is_never_opened"],
        "why": "only folders refused: a FIFO named state.pt is opened and blocks the resume",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "if failure.errno in (errno.ENOSPC, errno.EDQUOT):",
        "replace": "if failure.errno == errno.EDQUOT:",
        "tests": [f"{T_FOLDER}::test_a_full_disk_during_a_save_says_so_and_leaves_the_previous_checkpoint"],
        "why": "a full disk (ENOSPC) not named as one",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "                    shutil.rmtree(tmp, ignore_errors=True)  # nothing that looks like a checkpoint",
        "replace": "                    pass  # nothing that looks like a checkpoint",
        "tests": [f"{T_FOLDER}::test_a_full_disk_during_a_save_says_so_and_leaves_the_previous_checkpoint"],
        "why": "a failed save leaves its half-written temporary folder behind on the full disk",
    },
    # -- sharded: 0-dim parameters, Adagrad (sharded.py, _shard_optimizer.py) -------------------------------
    {
        "file": "src/composetrain/transforms/sharded.py",
        "find": "/ world).to(p.dtype) if count.real > 0 else None",
        "replace": "/ count.real).to(p.dtype) if count.real > 0 else None",
        "tests": [f"{T_SHARD}::test_zero_dim_parameters_and_adagrad_give_the_plain_update"],
        "why": "a 0-dim gradient some ranks lack averaged over the ranks that have one, not over all",
    },
    {
        "file": "src/composetrain/transforms/sharded.py",
        "find": "        remake_initial_state(state.optimizer)\n",
        "replace": "        pass\n",
        "tests": [f"{T_SHARD}::test_zero_dim_parameters_and_adagrad_give_the_plain_update"],
        "why": "Adagrad's __init__ state left keyed by the unsharded parameters",
    },
    {
        "file": "src/composetrain/transforms/_shard_optimizer.py",
        "find": "if v.dtype != w.dtype or v.shape != w.shape or not torch.equal(v, w):",
        "replace": "if v.dtype != w.dtype or v.shape != w.shape:",
        "tests": [f"{T_SHARD}::test_adagrad_state_made_by_training_is_refused_before_sharding"],
        "why": "Adagrad state made by training taken for its initial state, and lost by sharding",
    },
    # -- activation checkpointing: random streams and keywords (_recompute.py, activation_checkpointing.py) --
    {
        "file": "src/composetrain/transforms/_recompute.py",
        "find": "        self.start.restore()\n",
        "replace": "",
        "tests": [f"{T_RANDOM}::test_python_and_numpy_draws_are_replayed"],
        "why": "the recomputation draws Python's and NumPy's numbers afresh, not the forward's",
    },
    {
        "file": "src/composetrain/transforms/_recompute.py",
        "find": "        stack.callback(Generators(HOST).restore)\n",
        "replace": "",
        "tests": [f"{T_RANDOM}::test_draws_after_the_forward_are_not_replayed_into_the_recomputation"],
        "why": "the recomputation leaves the streams where the forward left them: later draws repeat",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": 'HOST = ("python", "numpy")',
        "replace": 'HOST = ("python",)',
        "tests": [f"{T_RANDOM}::test_python_and_numpy_draws_are_replayed"],
        "why": "only Python's stream replayed, NumPy's not",
    },
    {
        "file": "src/composetrain/transforms/activation_checkpointing.py",
        "find": "return checkpoint(run, *args, *kwargs.values(), use_reentrant=False,",
        "replace": "return checkpoint(forward, *args, **kwargs, use_reentrant=False,",
        "tests": ["tests/test_checkpointed_keywords.py::test_every_keyword_reaches_the_module_unchanged"],
        "why": "keywords passed to checkpoint, which takes early_stop=, debug=... as its own options",
    },
    {
        "file": "src/composetrain/transforms/activation_checkpointing.py",
        "find": "def _run_checkpointed(forward: Callable[..., Any], module: nn.Module, /, *args",
        "replace": "def _run_checkpointed(forward: Callable[..., Any], module: nn.Module, *args",
        "tests": ["tests/test_checkpointed_keyword_collisions.py"],
        "why": "a module keyword named forward= or module= taken by the wrapper",
    },
    # -- float32 constants of loss scaling (_scaling.py) --------------------------------------------------
    {
        "file": "src/composetrain/transforms/_scaling.py",
        "find": "found[device] = torch.zeros(1, dtype=torch.float32, device=device)",
        "replace": "found[device] = torch.zeros(1, device=device)",
        "tests": ["tests/test_default_dtype.py::test_the_scaling_constants_are_float32_whatever_the_default"],
        "why": "the found-inf flag follows the default dtype, which the fused kernel refuses",
    },
    {
        "file": "src/composetrain/transforms/_scaling.py",
        "find": "self._ones[device] = torch.ones(1, dtype=torch.float32, device=device)",
        "replace": "self._ones[device] = torch.ones(1, device=device)",
        "tests": ["tests/test_default_dtype.py::test_the_scaling_constants_are_float32_whatever_the_default"],
        "why": "the scale of 1 follows the default dtype, which the fused kernel refuses",
    },
    # -- accumulate('auto')'s rollback (_auto_accumulate.py) -----------------------------------------------
    {
        "file": "src/composetrain/core/rng.py",
        "find": "            random.setstate(self.py_rng)\n",
        "replace": "            pass\n",
        "tests": [f"{T_UNDO}::test_python_numpy_torch_streams_and_every_buffer_are_those_of_accumulate_n"],
        "why": "a failed attempt's Python draws are not given back",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": "            numpy.random.set_state(saved)\n",
        "replace": "            del saved\n",
        "tests": [f"{T_UNDO}::test_python_numpy_torch_streams_and_every_buffer_are_those_of_accumulate_n"],
        "why": "a failed attempt's NumPy draws are not given back",
    },
    {
        "file": "src/composetrain/transforms/_auto_accumulate.py",
        "find": "torch._foreach_copy_(self.buffers, self.values)",
        "replace": "pass",
        "tests": [f"{T_UNDO}::test_python_numpy_torch_streams_and_every_buffer_are_those_of_accumulate_n"],
        "why": "buffers a failed attempt changed in place keep its values",
    },
    {
        "file": "src/composetrain/transforms/_auto_accumulate.py",
        "find": "self.tables = [(m, dict(m._buffers)) for m in model.modules()]",
        "replace": "self.tables = [(m, dict(m._buffers)) for m in model.modules() if m._buffers]",
        "tests": ["tests/test_auto_undo_completeness.py::test_a_buffer_registered_by_a_failed_attempt_is_removed"],
        "why": "a buffer a failed attempt registered on a module that had none stays",
    },
    # -- launch variables (rendezvous.py) -----------------------------------------------------------------
    {
        "file": "src/composetrain/launch/rendezvous.py",
        "find": 'local = int(text) if re.fullmatch(r"\\s*[0-9]+\\s*", text) else 0',
        "replace": "local = int(text) if text.strip().isdigit() else 0",
        "tests": [f"{T_ODD}::test_a_local_world_size_that_is_no_count_is_refused_naming_it"],
        "why": "LOCAL_WORLD_SIZE='²' passes isdigit and ends in a bare int() error",
    },
    {
        "file": "src/composetrain/launch/rendezvous.py",
        "find": 'if "SLURM_STEP_NODELIST" in env:',
        "replace": 'if "SLURM_STEP_NODELIST" in env and "SLURM_JOB_NODELIST" not in env:',
        "tests": [f"{T_ODD}::test_a_step_on_part_of_the_allocation_meets_on_its_own_first_node"],
        "why": "a step on part of the job meets on the job's first node",
    },
    {
        "file": "src/composetrain/launch/rendezvous.py",
        "find": "if world > 1 and not addr.strip():",
        "replace": "if world > 1 and not addr:",
        "tests": [f"{T_ODD}::test_an_empty_master_addr_is_refused_before_waiting_for_the_others"],
        "why": "a MASTER_ADDR of spaces makes the other ranks wait out the timeout",
    },
    # -- the lr helpers (lr_rules.py) ---------------------------------------------------------------------
    {
        "file": "src/composetrain/transforms/lr_rules.py",
        "find": "if steps > 2**53:",
        "replace": "if steps > 2**53 + 1:",
        "tests": [f"{T_LR}::test_a_warmup_too_long_for_a_float_is_refused_when_built"],
        "why": "warmup's step limit off by one",
    },
    {
        "file": "src/composetrain/transforms/lr_rules.py",
        "find": "with contextlib.suppress(TypeError, ValueError, RuntimeError, OverflowError):",
        "replace": "with contextlib.suppress(TypeError, ValueError, RuntimeError):",
        "tests": [f"{T_LR}::test_a_then_returning_an_int_too_large_for_a_float_is_refused_by_name"],
        "why": "then() returning an int past 1e308 raises a bare OverflowError",
    },
    {
        "file": "src/composetrain/transforms/lr_rules.py",
        "find": "if not (math.isfinite(number) and number >= 0):",
        "replace": "if not number >= 0:",
        "tests": ["tests/test_lr_limits.py::test_a_then_that_returns_no_multiplier_is_refused_at_its_call"],
        "why": "then() returning inf is taken as a multiplier",
    },
    # -- the plot (plot.py) -------------------------------------------------------------------------------
    {
        "file": "src/composetrain/plot.py",
        "find": "except (UnicodeDecodeError, ValueError, RecursionError) as e:",
        "replace": "except (UnicodeDecodeError, ValueError) as e:",
        "tests": [f"{T_PLOT}::test_a_line_the_reader_cannot_take_is_skipped_and_counted"],
        "why": "a line nested too deep crashes the reader",
    },
    {
        "file": "src/composetrain/plot.py",
        "find": "if not (_is_int(step) and _is_number(step)):",
        "replace": "if not _is_int(step):",
        "tests": [f"{T_PLOT}::test_a_line_the_reader_cannot_take_is_skipped_and_counted"],
        "why": "a step no float holds is kept, and crashes the drawing",
    },
    {
        "file": "src/composetrain/plot.py",
        "find": 'f"{m!r} (metric)" if m in titles else m',
        "replace": "m",
        "tests": [f"{T_PLOT}::test_a_metric_named_like_a_fixed_panel_keeps_its_own_panel"],
        "why": "a metric named 'training loss' takes the loss panel",
    },
    {
        "file": "src/composetrain/plot.py",
        "find": 'target = target.with_name(target.name + ".png")',
        "replace": "pass",
        "tests": [f"{T_PLOT}::test_the_path_printed_is_the_file_written"],
        "why": "an output without a suffix: the path returned names no file",
    },
]
