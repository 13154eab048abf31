"""A public name assigned on the package before the others load keeps the value assigned (the lazy loading of
the other names must not undo it, as ``import composetrain`` never did when it was eager)."""

import subprocess
import sys


def test_a_name_assigned_before_the_first_lookup_is_kept():
    script = (
        "import composetrain as ct\n"
        "ct.run = 'patched'\n"
        "ct.TrainState\n"  # loads every other public name
        "from composetrain import run\n"
        "print(ct.run, run, ct.accumulate.__module__)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["patched", "patched", "composetrain.transforms.accumulate"]
