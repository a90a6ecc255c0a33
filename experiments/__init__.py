"""Entry points, run as `python -m experiments.NAME`.

rmjax needs no PyTorch (it is a test extra). Where it is installed anyway, transformers imports it with the
tokenizer classes (2-3 s at every job start) and, where it is not, prints an advisory line about it. A job run
as a program tells transformers that torch is unavailable (its answer is cached for the process), so it starts
faster and runs exactly as from the runtime install. Python sets sys.argv[0] to "-m" while it locates the module
of `python -m`, i.e. while this package is imported: an in-process import (tests, notebooks) changes nothing.
"""

import importlib.abc
import importlib.util
import os
import signal
import sys


def not_a_job(module: str) -> None:
    """`python -m experiments.candidates` (a module of flags the jobs share) ran nothing and exited 0 whatever
    its flags, as if a job had finished: say what to run instead."""
    print(f"error: {module} is not a job: it holds flags or helpers the jobs share; run a job, e.g. "
          "`python -m experiments.sweep --help` (README: One command per job).", file=sys.stderr, flush=True)
    sys.exit(2)


def interrupted_while_starting(signum, frame):
    """Ctrl-C while a job imports (JAX, transformers: a second or more) printed a traceback; nothing is written
    yet, so one line and exit 130. cli.run puts Python's own handler back once the job's main is about to run."""
    print("\ninterrupted while starting: nothing was written.", file=sys.stderr, flush=True)
    os._exit(130)


if sys.argv[:1] == ["-m"]:
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where SIGINT is ignored (nohup)
        signal.signal(signal.SIGINT, interrupted_while_starting)


class _TorchCheckedWithoutTorch(importlib.abc.MetaPathFinder):
    """Where torch is installed: the first import of transformers' import_utils runs its torch check at once, with
    torch hidden, before any other module can ask. A job imports transformers only when it loads a tokenizer, so
    one refused by its flags does not import it for this (1.2 s a start)."""

    name = "transformers.utils.import_utils"

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        run = spec.loader.exec_module

        def run_then_check(module):
            run(module)
            # (a loader shared by several modules runs them all through here: only this one is checked)
            if module.__name__ != self.name or "torch" in sys.modules:  # torch imported already: transformers finds it
                return
            sys.modules["torch"] = None  # for the check alone: importlib finds no torch
            try:
                module.is_torch_available()  # lru_cached: False for the rest of the process
            finally:
                del sys.modules["torch"]  # other libraries (scipy's array API helpers) look torch up in sys.modules

        spec.loader.exec_module = run_then_check
        return spec


# Only where torch is installed: elsewhere transformers finds none by itself.
if sys.argv[:1] == ["-m"] and "torch" not in sys.modules and importlib.util.find_spec("torch") is not None:
    sys.meta_path.insert(0, _TorchCheckedWithoutTorch())
