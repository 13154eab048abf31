# ruff: noqa: E501
"""Planted bugs for issue 29 item 8 (a refused call changes nothing) and its ct.ema answers, each caught by the
tests named."""

HARNESS = "tests/test_refusals_change_nothing.py"
SCHEDULERS = "tests/test_scheduler_kinds.py"
SETTINGS = "tests/test_ema.py"

MUTANTS = [
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "            self._verified(state, done, ctx)  # the last refusal: from here on the call changes the state\n            undo = None\n",
        "replace": "            undo = None\n            self._verified(state, done, ctx)\n",
        "tests": [HARNESS],
        "why": "29.8: the undo is dropped before verify: a buffer ct.ema refuses stays changed, the generators advanced",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "            self.verify(state, done, ctx)\n        except Exception:\n",
        "replace": "        except Exception:\n",
        "tests": [HARNESS],
        "why": "29.8: no verify phase: ct.ema's buffer check runs in its update, after optimizer.step()",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "            kept.keep_buffers(state.model)  # after prepare, which may place the model (once)\n",
        "replace": "",
        "tests": [HARNESS],
        "why": "29.8: buffers not kept: BatchNorm's running statistics of a refused call stay",
    },
    {
        "file": "src/composetrain/core/_rollback.py",
        "find": "            module._buffers.clear()\n            module._buffers.update(table)\n",
        "replace": "            pass\n",
        "tests": [HARNESS],
        "why": "29.8: buffer values put back but not the tables: a buffer the forward re-registered or added stays",
    },
    {
        "file": "src/composetrain/core/_rollback.py",
        "find": "        for p, g in self.grads:\n            p.grad = g\n",
        "replace": "",
        "tests": [HARNESS],
        "why": "29.8: gradients set before a refused call are lost",
    },
    {
        "file": "src/composetrain/core/_rollback.py",
        "find": "self.grads = [(p, p.grad.clone()) for p in params if p.grad is not None]",
        "replace": "self.grads = [(p, p.grad) for p in params if p.grad is not None]",
        "tests": [HARNESS],
        "why": "29.8: the earlier gradients kept by reference: backward adds the refused call's into them",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": "            numpy.random.set_state(saved)\n",
        "replace": "            pass\n",
        "tests": [HARNESS],
        "why": "29.8: NumPy's generator advanced by a refused call's step",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": "            random.setstate(self.py_rng)\n",
        "replace": "            pass\n",
        "tests": [HARNESS],
        "why": "29.8: Python's generator advanced by a refused call's step",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": "            torch.set_rng_state(self.rng)\n",
        "replace": "            pass\n",
        "tests": [HARNESS],
        "why": "29.8: torch's generator advanced by a refused call's dropout",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": 'for key, value in metric_names(metrics, TRAIN_FIELDS, "the step", repr(who)).items():',
        "replace": "for key, value in metrics.items():",
        "tests": [HARNESS],
        "why": "29.8: metric names unchecked in the pass: ct.run refuses them only after the update",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": "            if value.is_complex():  # a log record's float() would keep the real part alone\n",
        "replace": "            if False:\n",
        "tests": [HARNESS],
        "why": "29.8: a complex metric passes the step, refused by ct.run after the update",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "        if params is None or live.keys() != mine.keys() or not all(_alike(mine[k], b) for k, b in buffers.items()):",
        "replace": "        if params is None or live.keys() != mine.keys():",
        "tests": [HARNESS],
        "why": "29.8: verify sees a buffer the forward cast but does not check it: refused late or averaged across dtypes",
    },
    {
        "file": "src/composetrain/transforms/precision.py",
        "find": "        if ctx.notes.get(self.role) and not state.transform_state(self.role, LossScaling).unscaled:",
        "replace": "        if False:",
        "tests": [HARNESS],
        "why": "29.8: the never-unscaled refusal gone from verify: the update runs on unscaled gradients",
    },
    {
        "file": "src/composetrain/core/state.py",
        "find": "            needed = step_needs(scheduler)\n",
        "replace": "            needed = []\n",
        "tests": [SCHEDULERS],
        "why": "29.8: a timm scheduler accepted; its step() raises TypeError after the first optimizer.step()",
    },
    {
        "file": "src/composetrain/core/_state_checks.py",
        "find": '    if (own and "step" in getattr(obj, "__dict__", {})) or not callable(method):',
        "replace": "    if not callable(method):",
        "tests": [SCHEDULERS],
        "why": "29.8: a step set on the scheduler instance is judged by its class's",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "        if t.shape != a.shape or t.dtype != a.dtype:  # copy_ would cast silently, losing the averages' digits",
        "replace": "        if t.shape != a.shape:",
        "tests": [SETTINGS],
        "why": "29: ema_model(into=model.half()) casts the averages silently",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": '        return {"averages": dict(self.tensors), "n_averaged": self.n_averaged, "settings": dict(self.settings)}',
        "replace": '        return {"averages": dict(self.tensors), "n_averaged": self.n_averaged}',
        "tests": [SETTINGS],
        "why": "29: the EMA's settings not checkpointed: a resume with another decay is silent",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "        if isinstance(saved_settings, Mapping) and dict(saved_settings) != self.settings:",
        "replace": '        if isinstance(saved_settings, Mapping) and saved_settings.get("decay") != self.settings["decay"]:',
        "tests": [SETTINGS],
        "why": "29: only the decay compared at a resume: another every, warmup or formula is silent",
    },
]
