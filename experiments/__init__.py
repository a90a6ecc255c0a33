"""Entry points, run as `python -m experiments.NAME`.

rmjax needs no PyTorch (it is a test extra). Where it is installed anyway, transformers imports it with the
tokenizer classes (2-3 s at every job start) and, where it is not, prints an advisory line about it. A job run
as a program tells transformers that torch is unavailable (its answer is cached for the process), so it starts
faster and runs exactly as from the runtime install. Python sets sys.argv[0] to "-m" while it locates the module
of `python -m`, i.e. while this package is imported: an in-process import (tests, notebooks) changes nothing.
"""

import importlib.util
import os
import signal
import sys


def interrupted_while_starting(signum, frame):
    """Ctrl-C while a job imports (JAX, transformers: a second or more) printed a traceback; nothing is written
    yet, so one line and exit 130. cli.run puts Python's own handler back once the job's main is about to run."""
    print("\ninterrupted while starting: nothing was written.", file=sys.stderr, flush=True)
    os._exit(130)


if sys.argv[:1] == ["-m"]:
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where SIGINT is ignored (nohup)
        signal.signal(signal.SIGINT, interrupted_while_starting)
# Only where torch is installed: elsewhere transformers finds none by itself, and a job that never loads a
# tokenizer (analyze) need not import transformers for this.
if sys.argv[:1] == ["-m"] and "torch" not in sys.modules and importlib.util.find_spec("torch") is not None:
    sys.modules["torch"] = None  # for the check alone: importlib finds no torch
    try:
        from transformers.utils import import_utils

        import_utils.is_torch_available()  # lru_cached: False for the rest of the process
    finally:
        del sys.modules["torch"]  # other libraries (scipy's array API helpers) look torch up in sys.modules
