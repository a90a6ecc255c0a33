"""Test set-up: 8 fake CPU devices and exact float32 matmuls, before JAX initializes; NaN never equals NaN."""

import functools
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The test extras bring libtpu (tests/test_plan.py compiles for TPU slices through it): the tests run on the CPU,
# and libtpu is started only where a plan asks for a slice's devices.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from tests.cli import COMPILE_CACHE, QUICK_OPTIONS  # noqa: E402  (the persistent XLA cache the subprocesses share)

for _name, _value in COMPILE_CACHE.items():
    os.environ.setdefault(_name, _value)

import jax  # noqa: E402
from jax._src import compiler as _compiler  # noqa: E402

# The persistent cache serves one-device programs only: a multi-device CPU program with collectives, loaded back
# from it, hangs in its first collective (tests/cli.py COMPILE_CACHE); those compile afresh. The hook is private
# to the pinned jax: under another jax the in-process tests use no persistent cache at all.
_resolve_compilation_strategy = getattr(_compiler, "_resolve_compilation_strategy", None)


def _one_device_programs_only(computation, devices, *args):
    key, options = _resolve_compilation_strategy(computation, devices, *args)
    return (key if devices.size == 1 else None), options


if _resolve_compilation_strategy is None:
    jax.config.update("jax_enable_compilation_cache", False)
else:
    _compiler._resolve_compilation_strategy = _one_device_programs_only
jax.config.update("jax_num_cpu_devices", 8)

# CPU programs compile with tests/cli.py's QUICK_OPTIONS (it says why), except in tests marked `optimized`, whose
# programs take longer to run than to compile (real models; a tiny one over its whole vocabulary). A compile option:
# it enters the persistent cache's key. The hook is private to the pinned jax: under another jax, compiles keep
# their defaults.
from jax._src.interpreters import pxla as _pxla  # noqa: E402

_create_compile_options = getattr(_pxla, "create_compile_options", None)
_quick_compile = {"on": True}


def _quick_on_cpu(computation, tuple_args, to_inputs, to_outputs, backend, devices, compiler_options):
    if _quick_compile["on"] and backend.platform == "cpu":
        compiler_options = {**QUICK_OPTIONS, **compiler_options}
    return _create_compile_options(computation, tuple_args, to_inputs, to_outputs, backend, devices, compiler_options)


if _create_compile_options is not None:
    _pxla.create_compile_options = _quick_on_cpu

import numpy.testing  # noqa: E402
import pytest  # noqa: E402

# PyTorch (the test extras' reference) computes on one thread: its references are tiny, and beside XLA's threads
# and the other xdist worker on a 2-core runner its OpenMP threads wait on each other (a tiny Llama's forward:
# 12 ms on one thread, 80-550 ms on two under load). The thread count changes no tolerance: each reference is
# held to a derived error bound.
try:
    import torch  # noqa: E402
except ImportError:  # the runtime install alone (no test extras)
    torch = None
else:
    torch.set_num_threads(1)

# numpy's assert_allclose counts NaN == NaN as a match, so a test whose reference and result are both NaN
# passes whatever the code does (one did: tokens drawn past a tiny vocabulary). Here it is a failure
# unless a test says equal_nan=True.
numpy.testing.assert_allclose = functools.partial(numpy.testing.assert_allclose, equal_nan=False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the test's fixtures are set up (a module's too): their compiles follow the test's mark."""
    _quick_compile["on"] = item.get_closest_marker("optimized") is None


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_code_between_modules():
    """A worker runs hundreds of tests' programs, many jitted outside rmjax.compiled (tests/jitted.py): after each
    module, free them if the process nears the kernel's map limit (at it, XLA segfaults in the next compile)."""
    yield
    from rmjax import compiled

    compiled.release_near_map_limit()


@pytest.fixture
def victim(tmp_path):
    """A file outside the job's folder that a planted link points at (holding tests.cli.VICTIM_TEXT)."""
    from tests.cli import VICTIM_TEXT

    path = tmp_path / "elsewhere" / "victim.txt"
    path.parent.mkdir()
    path.write_text(VICTIM_TEXT)
    return path


# The two tiny models are built once per process (xdist worker), not per module: 25 modules use rm_folder and 15
# lm_folder. Read-only to every test: a test that edits a model edits its copy (tests.cli.copy_folder).
@pytest.fixture(scope="session")
def rm_folder(tmp_path_factory):
    """A tiny random reward model (Llama) with the real SmolLM2 tokenizer and chat template."""
    from tests import tiny

    _, folder = tiny.save_reward_model_with_tokenizer(tmp_path_factory.mktemp("rm") / "rm")
    return folder


@pytest.fixture(scope="session")
def lm_folder(tmp_path_factory):
    """A tiny causal LM with the real SmolLM2 tokenizer and chat template."""
    from tests import tiny

    folder = tmp_path_factory.mktemp("lm") / "lm"
    hf = tiny.build_hf_model("llama3", vocab_size=49152, pad_token_id=2, bos_token_id=1, eos_token_id=2)
    tiny.save_hf_model(hf, folder)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / f).write_bytes((tiny.smollm2_tokenizer_folder() / f).read_bytes())
    return folder


@pytest.fixture(scope="module")
def lm(lm_folder):
    """`lm_folder` loaded (a module's own: a consuming training run deletes arrays of the models it is given)."""
    from rmjax.loading import load

    return load(str(lm_folder))


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """A tiny tied Llama 3.2 LM with the SmolLM2 tokenizer and template, the HF model, and an RM made from it
    (its own prior)."""
    import shutil

    from rmjax.loading import load
    from rmjax.loading.reward_head import reward_model_from_lm
    from tests import tiny

    hf = tiny.build_hf_model("llama3.2", vocab_size=49152, pad_token_id=2, bos_token_id=1, eos_token_id=2, seed=3)
    folder = tiny.save_hf_model(hf, tmp_path_factory.mktemp("tied") / "lm")
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny.smollm2_tokenizer_folder() / f, folder / f)
    lm = load(str(folder))
    return hf, lm, reward_model_from_lm(lm, seed=1)


# Modules with the longest tests run first, whole (a module's fixtures are set up once): with two xdist workers a
# minute-long test started last runs alone while the other worker idles. Measured in CI (`--durations`).
HEAVY_MODULES = ("test_frontier.py", "test_real_models.py", "test_safety_resume2.py", "test_attribution_real.py",
                 "test_plan.py", "test_disagree.py", "test_planted.py", "test_audit_planted.py", "test_audit_job.py",
                 "test_multihost.py", "test_sharding.py", "test_safety_jobs2.py")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        name = item.path.name
        return HEAVY_MODULES.index(name) if name in HEAVY_MODULES else len(HEAVY_MODULES)

    items.sort(key=rank)  # stable: each module keeps its own order
