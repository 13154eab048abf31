"""``import composetrain as ct`` loads its public names on first use (so that ``python -m composetrain.plot``
needs no torch), and reads exactly as an eager package: every name, the functions that share a submodule's
name, ``from composetrain import *``."""

import subprocess
import sys

import composetrain as ct


def test_every_public_name_is_the_object_its_module_defines():
    import importlib

    assert set(ct._WHERE) == set(ct.__all__)
    for name in ct.__all__:
        assert getattr(ct, name) is getattr(importlib.import_module(ct._WHERE[name]), name), name
    assert set(ct.__all__) <= set(dir(ct))


def run(script: str) -> str:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_submodule_imported_first_does_not_hide_the_function_of_its_name():
    out = run(
        "import composetrain.launch.rendezvous, composetrain.transforms.accumulate\n"
        "import composetrain.transforms.distributed, composetrain.transforms.sharded\n"
        "import composetrain as ct\n"
        "from composetrain import distributed\n"
        "print(type(ct.rendezvous).__name__, type(ct.accumulate).__name__, type(distributed).__name__,\n"
        "      type(ct.sharded).__name__, type(ct.data_parallel).__name__)\n"
    )
    assert out == "function function function function function"


def test_import_star_and_unknown_names():
    out = run(
        "import sys\nimport composetrain as ct\nprint('torch' in sys.modules)\n"
        "from composetrain import *\nprint(run.__module__, TrainState.__name__)\n"
        "try:\n    ct.no_such_thing\nexcept AttributeError as e:\n    print(e)\n"
    )
    assert out.splitlines() == [
        "False",
        "composetrain.driver.run TrainState",
        "module 'composetrain' has no attribute 'no_such_thing'",
    ]


def test_without_numpy_ct_run_trains_and_only_the_data_layers_names_need_it():
    """NumPy is optional for torch and for composetrain except ct.cache and ct.hdf5: a run over a TensorDataset
    works without it, and asking for ct.cache names what is missing (before: the first public name imported the
    data layer, whose NumPy import failed every name, and ct.run's driver imported it too)."""
    out = run(
        "import sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "sys.modules['numpy'] = None\n"
        "import torch, torch.nn.functional as F\n"
        "from torch.utils.data import TensorDataset\n"
        "import composetrain as ct\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(3, 2)\n"
        "state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))\n"
        "data = TensorDataset(torch.randn(16, 3), torch.randint(0, 2, (16,)))\n"
        "step = lambda m, b: F.cross_entropy(m(b[0]), b[1])\n"
        "result = ct.run(ct.accumulate(2)(step), state, data, batch_size=4, epochs=1, progress=False)\n"
        "print(result.steps, 'numpy' in sys.modules and sys.modules['numpy'] is not None)\n"
        "try:\n"
        "    ct.cache\n"
        "except ImportError as e:\n"
        "    print('refused', 'numpy' in str(e))\n"
    )
    assert out.splitlines() == ["4 False", "refused True"], out
